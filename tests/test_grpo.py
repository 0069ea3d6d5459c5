"""GRPO math on hand-computed tensors, and parity with TRL's GRPOTrainer loss on identical inputs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rookworld import grpo
from rookworld.grpo import BetaController, GRPOConfig

NAN = float("nan")


def cfg(**overrides) -> GRPOConfig:
    """A config without the KL term unless a test asks for one (the trainer's default beta is not 0)."""
    return GRPOConfig(**{"beta": 0.0, **overrides})


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("overrides, reason", [
    ({"std_scaling": "global"}, "std_scaling must be one of"),
    ({"std_floor": 0.0}, "std_floor must be > 0"),
    ({"adv_clip": 0.0}, "adv_clip must be > 0"),
    ({"aggregation": "mean"}, "aggregation must be one of"),
    ({"eps_low": 1.0}, "eps_low must be in [0, 1)"),
    ({"eps_high": -0.1}, "eps_high must be >= 0"),
    ({"beta": -0.01}, "beta must be >= 0"),
    ({"kl_estimator": "k2"}, "kl_estimator must be one of"),
    ({"kl_estimator": "full", "kl_importance_weight": True}, "kl_importance_weight must be false"),
    ({"beta_schedule": "cosine"}, "beta_schedule must be one of"),
    ({"beta_schedule": "warmup", "beta_ramp_steps": -1}, "must be >= 0"),
    ({"beta_warmup_steps": 5}, "only act with beta_schedule 'warmup'"),
    ({"kl_target": 0.0}, "kl_target must be > 0"),
    ({"kl_horizon": 0.5}, "kl_horizon must be >= 1"),
    ({"beta_min": 0.5, "beta_max": 0.1}, "beta_min <= beta_max"),
    ({"beta_schedule": "adaptive", "beta": 0.0}, "needs 0 < beta"),
    ({"beta_schedule": "adaptive", "beta": 2.0, "beta_max": 1.0}, "needs 0 < beta"),
    ({"entropy_coef": -1.0}, "entropy_coef must be >= 0"),
])
def test_config_rejects_broken_invariants_with_the_reason(overrides, reason):
    with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace(")", r"\)")):
        GRPOConfig(**overrides)


def test_kl_importance_weight_follows_the_estimator_unless_set():
    assert GRPOConfig().kl_importance_weight is True and GRPOConfig(kl_estimator="k1").kl_importance_weight is True
    assert GRPOConfig(kl_estimator="full").kl_importance_weight is False  # `--kl-estimator full` alone works
    assert GRPOConfig(kl_importance_weight=False).kl_importance_weight is False


def test_dr_grpo_denominator_counts_completion_tokens_not_the_padded_width():
    logp, old, adv, mask = clipped_example()
    wide = torch.nn.functional.pad(mask, (4, 0), value=False)  # prompt columns before the completion
    pad = lambda x: torch.nn.functional.pad(x, (4, 0), value=0.0)  # noqa: E731
    loss, _ = grpo.loss(pad(logp), pad(old), None, adv, wide, cfg(aggregation="dr_grpo"), max_completion_length=3)
    assert loss.item() == pytest.approx((-2.7 + 1.9) / (2 * 3))


def test_config_fields_all_have_help():
    import dataclasses
    assert all(f.metadata.get("help") for f in dataclasses.fields(GRPOConfig))


# ---------------------------------------------------------------- advantages

def test_group_advantages_and_zero_std_groups():
    # Group 0: mean 0.5, centred +-0.5, unbiased var 6 * 0.25 / 5 = 0.3 -> A = +-0.5 / sqrt(0.3) = +-0.912871.
    # Group 1: six equal rewards of 0.3; in float32 their mean is off by 3e-8, which the 1e-4 floor would blow up
    # to 3e-4 -- the group must still get exactly 0 and be counted.
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [0.3] * 6])
    out = grpo.advantages(rewards, cfg(std_scaling="group"))
    assert torch.allclose(out.values[0], torch.tensor([1.0, -1, -1, 1, 1, -1]) * 0.912871, atol=1e-6)
    assert torch.equal(out.values[1], torch.zeros(6))
    assert out.zero_std.tolist() == [False, True]
    assert out.frac_zero_std == 0.5


def test_group_advantages_hand_computed_g4():
    # mean 0.5, centred +-0.5, unbiased std = sqrt(4 * 0.25 / 3) = 0.57735 -> A = +-0.5 / 0.57735 = +-0.866025
    out = grpo.advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), cfg())
    assert torch.allclose(out.values, torch.tensor([[0.866025, -0.866025, -0.866025, 0.866025]]), atol=1e-6)
    assert out.frac_zero_std == 0.0


def test_batch_std_scaling_divides_group_centred_rewards_by_the_batch_std():
    # group means 0.5 and 3 -> centred [0.5, -0.5], [0, 0]; batch rewards [1, 0, 3, 3]: mean 1.75,
    # squared deviations 0.5625 + 3.0625 + 1.5625 + 1.5625 = 6.75, / 3 = 2.25, std 1.5 -> [1/3, -1/3], [0, 0]
    out = grpo.advantages(torch.tensor([[1.0, 0.0], [3.0, 3.0]]), cfg(std_scaling="batch"))
    assert torch.allclose(out.values, torch.tensor([[1 / 3, -1 / 3], [0.0, 0.0]]))
    assert out.zero_std.tolist() == [False, True]


def test_no_std_scaling_keeps_the_centred_rewards():
    out = grpo.advantages(torch.tensor([[1.0, 0.0, 0.5]]), cfg(std_scaling="none"))
    assert torch.allclose(out.values, torch.tensor([[0.5, -0.5, 0.0]]))


def test_std_floor_bounds_tiny_groups():
    # std of [0, 1e-6] = 7.07e-7 < floor 1e-4 -> A = +-5e-7 / 1e-4 = +-0.005 (not +-0.707)
    out = grpo.advantages(torch.tensor([[0.0, 1e-6]]), cfg(std_floor=1e-4))
    assert torch.allclose(out.values, torch.tensor([[-0.005, 0.005]]), atol=1e-7)
    assert out.zero_std.tolist() == [False]


def test_advantage_clipping():
    # mean 0.25, centred [-0.25 x3, 0.75], unbiased var (3 * 0.0625 + 0.5625) / 3 = 0.25, std 0.5
    # -> [-0.5 x3, 1.5], clipped at 1 -> [-0.5 x3, 1.0]
    out = grpo.advantages(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), cfg(adv_clip=1.0))
    assert torch.allclose(out.values, torch.tensor([[-0.5, -0.5, -0.5, 1.0]]))


def test_advantages_need_groups_of_two():
    with pytest.raises(ValueError, match="G >= 2"):
        grpo.advantages(torch.tensor([[1.0], [0.0]]), cfg())


def test_rloo_subtracts_the_mean_of_the_other_rewards():
    # [1, 0, 0, 0]: the others' means are 0, 1/3, 1/3, 1/3 -> A = [1, -1/3, -1/3, -1/3]
    out = grpo.advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.4] * 4]), cfg(baseline="rloo", std_scaling="none"))
    assert torch.allclose(out.values[0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    assert torch.equal(out.values[1], torch.zeros(4)) and out.zero_std.tolist() == [False, True]
    # with the group std: the leave-one-out values over the std (0.5): [2, -2/3, -2/3, -2/3]
    scaled = grpo.advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), cfg(baseline="rloo"))
    assert torch.allclose(scaled.values[0], torch.tensor([2.0, -2 / 3, -2 / 3, -2 / 3]))


def test_ema_baseline_advantages_and_zero_std_groups():
    """'ema' takes each group's baseline from outside its rewards: R - b, over the std."""
    outside = "ema"
    rewards = torch.tensor([[1.0, 0.0], [0.8, 0.8]])
    baseline = torch.tensor([0.25, 0.5])
    none = grpo.advantages(rewards, cfg(baseline=outside, std_scaling="none"), baseline)
    # R - b; the equal group keeps its signal: both above their baseline
    assert torch.allclose(none.values, torch.tensor([[0.75, -0.25], [0.3, 0.3]]))
    assert none.zero_std.tolist() == [False, True]
    # group std: (R - b) / std of [1, 0] (0.7071); the equal group has no std and gets 0
    group = grpo.advantages(rewards, cfg(baseline=outside), baseline)
    assert torch.allclose(group.values, torch.tensor([[0.75 / 0.707107, -0.25 / 0.707107], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=f"baseline '{outside}' needs each group's baseline value"):
        grpo.advantages(rewards, cfg(baseline=outside))


def test_ema_baseline_averages_each_task_and_round_trips():
    ema = grpo.EMABaseline(momentum=0.75)
    tasks = ["P", "A", "P"]
    step1 = torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.5, 0.5]])  # P mean 0.5, A mean 1.0
    assert torch.allclose(ema.values(tasks, step1), torch.tensor([0.5, 1.0, 0.5]))  # first step: its own mean
    ema.update(tasks, step1)
    step2 = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])  # P mean 1.0, A mean 0.0
    assert torch.allclose(ema.values(tasks, step2), torch.tensor([0.5, 1.0, 0.5]))  # before this step's rewards
    ema.update(tasks, step2)
    assert ema.means == pytest.approx({"P": 0.75 * 0.5 + 0.25 * 1.0, "A": 0.75 * 1.0})
    copy = grpo.EMABaseline(momentum=0.75)
    copy.load_state_dict(json.loads(json.dumps(ema.state_dict())))
    assert copy.means == ema.means


@pytest.mark.parametrize("fields, message", [
    ({"baseline": "median"}, "baseline must be one of"),
    ({"baseline": "ema", "ema_momentum": 1.0}, "ema_momentum must be in"),
    ({"kl_direction": "forward"}, "kl_direction 'forward' needs kl_estimator 'full'"),
    ({"kl_estimator": "full", "kl_direction": "up"}, "kl_direction must be one of"),
    ({"beta_a_scale": -1.0}, "beta_a_scale must be >= 0"),
])
def test_bad_baseline_and_kl_direction_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**fields)


# ---------------------------------------------------------------- loss: one hand-computed example

def clipped_example():
    """Two sequences, eps 0.2 both sides. Ratios r = [[1.0, 1.5, 0.5], [0.5, 1.1, pad]], A = [+1, -1].

    seq 0 (A = +1): -min(r, clip(r)) = [-1, -min(1.5, 1.2), -min(0.5, 0.8)] = [-1, -1.2, -0.5], sum -2.7
                    (token 1 high-clipped; token 2 is below 1 - eps but A > 0, so not clipped)
    seq 1 (A = -1): max(r, clip(r)) = [max(0.5, 0.8), max(1.1, 1.1)] = [0.8, 1.1], sum 1.9 (token 0 low-clipped)
    The padding slot holds NaN everywhere: it must not leak into the loss or the gradients.
    """
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, NAN]])
    r = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.1, 1.0]])
    logp = (old + r.log()).masked_fill(old.isnan(), NAN).requires_grad_()
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([1.0, -1.0])
    return logp, old, adv, mask


@pytest.mark.parametrize("aggregation, kwargs, expected", [
    ("grpo", {}, (-2.7 / 3 + 1.9 / 2) / 2),          # (-0.9 + 0.95) / 2 = 0.025
    ("bnpo", {}, (-2.7 + 1.9) / 5),                  # -0.16
    ("dapo", {}, (-2.7 + 1.9) / 5),                  # -0.16: the global batch is this batch
    ("dapo", {"normalizer": 10.0}, (-2.7 + 1.9) / 10),  # -0.08
    ("dr_grpo", {"max_completion_length": 4}, (-2.7 + 1.9) / (2 * 4)),  # -0.1
])
def test_aggregation_modes_hand_computed(aggregation, kwargs, expected):
    logp, old, adv, mask = clipped_example()
    loss, stats = grpo.loss(logp, old, None, adv, mask, cfg(aggregation=aggregation), **kwargs)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["loss"] == pytest.approx(expected, abs=1e-6) and stats["pg_loss"] == stats["loss"]
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 2] == 0


def test_clip_stats_and_clipped_gradient():
    logp, old, adv, mask = clipped_example()
    loss, stats = grpo.loss(logp, old, None, adv, mask, cfg(aggregation="dapo"))
    assert stats["clip_frac/low"] == pytest.approx(1 / 5)
    assert stats["clip_frac/high"] == pytest.approx(1 / 5)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert stats["ratio/mean"] == pytest.approx((1 + 1.5 + 0.5 + 0.5 + 1.1) / 5)  # 0.92
    assert stats["ratio/max"] == pytest.approx(1.5)
    # d/dlogp of -A r = -A r where the unclipped branch is taken; 0 where the clip is active; / 5 tokens
    loss.backward()
    expected = torch.tensor([[-1.0, 0.0, -0.5], [0.0, 1.1, 0.0]]) / 5
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_asymmetric_clip_range():
    # eps_high 0.6: ratio 1.5 is inside [0.8, 1.6], so seq 0 becomes [-1, -1.5, -0.5] and nothing clips high.
    logp, old, adv, mask = clipped_example()
    loss, stats = grpo.loss(logp, old, None, adv, mask, cfg(aggregation="bnpo", eps_high=0.6))
    assert loss.item() == pytest.approx((-3.0 + 1.9) / 5)
    assert stats["clip_frac/high"] == 0.0 and stats["clip_frac/low"] == pytest.approx(0.2)


def test_adv_stats():
    logp, old, _, mask = clipped_example()
    _, stats = grpo.loss(logp, old, None, torch.tensor([2.0, -1.0]), mask, cfg())
    assert (stats["adv/mean"], stats["adv/std"], stats["adv/abs_max"]) == (0.5, 1.5, 2.0)


@pytest.mark.parametrize("aggregation", grpo.AGGREGATIONS)
def test_on_policy_gradient_is_minus_advantage_over_normalizer(aggregation):
    # num_iterations == 1: old_logp = logp.detach(), ratio exactly 1, d loss / d logp_it = -A_i * m_it / denom_it
    torch.manual_seed(0)
    logp = (-torch.rand(3, 4) * 3).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -2.0, 0.5])
    loss, stats = grpo.loss(logp, logp.detach(), None, adv, mask, cfg(aggregation=aggregation),
                            max_completion_length=5)
    loss.backward()
    lengths = mask.sum(1, keepdim=True)  # [4, 2, 1]
    denom = {"grpo": lengths * 3, "bnpo": 7.0, "dapo": 7.0, "dr_grpo": 3 * 5.0}[aggregation]
    assert torch.allclose(logp.grad, -adv[:, None] * mask / denom)
    assert stats["ratio/mean"] == 1.0 and stats["clip_frac"] == 0.0
    # old_logp is detached inside: passing logp itself (a trainer forgetting .detach()) gives the same gradient
    expected = logp.grad.clone()
    logp.grad = None
    grpo.loss(logp, logp, None, adv, mask, cfg(aggregation=aggregation), max_completion_length=5)[0].backward()
    assert torch.allclose(logp.grad, expected)


def test_float_and_bool_masks_agree_and_weights_are_refused():
    logp, old, adv, mask = clipped_example()
    by_bool, _ = grpo.loss(logp, old, None, adv, mask, cfg())
    by_float, _ = grpo.loss(logp, old, None, adv, mask.float(), cfg())
    assert by_bool.item() == by_float.item()
    with pytest.raises(ValueError, match="only 0 and 1"):
        grpo.loss(logp, old, None, adv, mask.float() * 0.5, cfg())


def test_bad_inputs_are_named():
    logp, old, adv, mask = clipped_example()
    with pytest.raises(ValueError, match="old_logp must have logp's shape"):
        grpo.loss(logp, old[:, :2], None, adv, mask, cfg())
    with pytest.raises(ValueError, match="adv must be"):
        grpo.loss(logp, old, None, adv[:1], mask, cfg())
    with pytest.raises(ValueError, match="one per sequence"):
        grpo.loss(logp, old, None, adv[:, None].expand(2, 3), mask, cfg())
    with pytest.raises(ValueError, match="needs `ref_logp`"):
        grpo.loss(logp, old, None, adv, mask, cfg(beta=0.1))
    with pytest.raises(ValueError, match="needs `kl_per_token`"):
        grpo.loss(logp, old, None, adv, mask, cfg(beta=0.1, kl_estimator="full", kl_importance_weight=False))
    with pytest.raises(ValueError, match="takes `ref_logp`, not the other"):
        grpo.loss(logp, old, None, adv, mask, cfg(), kl_per_token=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="needs the per-token `entropy`"):
        grpo.loss(logp, old, None, adv, mask, cfg(entropy_coef=0.01))
    with pytest.raises(ValueError, match="needs max_completion_length"):
        grpo.loss(logp, old, None, adv, mask, cfg(aggregation="dr_grpo"), max_completion_length=2)
    with pytest.raises(ValueError, match="takes no normalizer"):
        grpo.loss(logp, old, None, adv, mask, cfg(aggregation="bnpo"), normalizer=5.0)


# ---------------------------------------------------------------- KL terms

def kl_example():
    """One sequence, two tokens, on-policy (ratio 1), A = 0 so only the KL term is left.

    pi = [0.5, 0.8], pi_ref = [0.25, 0.8]: token 0 has log(pi_ref / pi) = log 0.5 = -0.693147, token 1 has 0.
    k3 = exp(-0.693147) + 0.693147 - 1 = 0.193147 (token 1: 0); k1 = logp - ref = 0.693147 (token 1: 0).
    """
    logp = torch.tensor([[0.5, 0.8]]).log().requires_grad_()
    ref = torch.tensor([[0.25, 0.8]]).log()
    return logp, ref, torch.zeros(1), torch.ones(1, 2, dtype=torch.bool)


LOG2 = math.log(2)


@pytest.mark.parametrize("estimator, weighted, value, grad0", [
    # gradients of the token-0 estimate w.r.t. logp at ratio 1:
    ("k3", False, 0.5 + LOG2 - 1, 1 - 0.5),               # d/dl [e^(ref-l) - (ref-l) - 1] = 1 - e^(ref-l)
    ("k3", True, 0.5 + LOG2 - 1, LOG2),                   # + k3 itself (d ratio / dl = 1): = l - ref exactly
    ("k1", False, LOG2, 1.0),                             # d/dl (l - ref) = 1
    ("k1", True, LOG2, LOG2 + 1),                         # + k1 itself
])
def test_sampled_token_kl_estimators(estimator, weighted, value, grad0):
    logp, ref, adv, mask = kl_example()
    config = cfg(aggregation="bnpo", beta=0.1, kl_estimator=estimator, kl_importance_weight=weighted)
    loss, stats = grpo.loss(logp, logp.detach(), ref, adv, mask, config)
    assert stats["kl/mean"] == pytest.approx(value / 2, abs=1e-6)      # token 1 contributes 0
    assert stats["kl_loss"] == pytest.approx(0.1 * value / 2, abs=1e-6)
    assert stats["kl_share"] == 1.0 and stats["pg_loss"] == 0.0
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(0.1 * grad0 / 2, abs=1e-6)
    assert logp.grad[0, 1].item() == pytest.approx(0.1 * (1.0 if estimator == "k1" else 0.0) / 2, abs=1e-6)


def test_kl_weight_scales_each_sequences_kl_term():
    """kl_weight (N,): sequence i's KL enters the loss at beta * w_i (the trainer's beta_a_scale on A rows);
    `kl/mean` stays the unweighted token mean."""
    logp, ref, _, _ = kl_example()  # one sequence: token KLs k3 = 0.193147 and 0
    logp2 = torch.cat([logp.detach(), logp.detach()]).requires_grad_()  # two copies of it
    ref2, adv, mask = torch.cat([ref, ref]), torch.zeros(2), torch.ones(2, 2, dtype=torch.bool)
    config = cfg(aggregation="bnpo", beta=0.1, kl_importance_weight=False)
    k3 = 0.5 + LOG2 - 1
    loss, stats = grpo.loss(logp2, logp2.detach(), ref2, adv, mask, config, kl_weight=torch.tensor([3.0, 0.0]))
    assert stats["kl/mean"] == pytest.approx(2 * k3 / 4, abs=1e-6)
    assert stats["kl_loss"] == pytest.approx(0.1 * 3 * k3 / 4, abs=1e-6)
    loss.backward()
    assert logp2.grad[0, 0].item() == pytest.approx(0.1 * 3 * 0.5 / 4, abs=1e-6) and logp2.grad[1].abs().sum() == 0
    ones, _ = grpo.loss(logp2, logp2.detach(), ref2, adv, mask, config, kl_weight=torch.ones(2))
    plain, _ = grpo.loss(logp2, logp2.detach(), ref2, adv, mask, config)
    assert ones.item() == pytest.approx(plain.item(), abs=1e-7)
    with pytest.raises(ValueError, match="kl_weight must be"):
        grpo.loss(logp2, logp2.detach(), ref2, adv, mask, config, kl_weight=torch.ones(2, 2))


def test_full_vocabulary_kl_is_taken_as_given():
    logp, _, adv, mask = kl_example()
    kl_full = torch.tensor([[0.3, 0.1]], requires_grad=True)
    config = cfg(aggregation="bnpo", beta=0.5, kl_estimator="full", kl_importance_weight=False)
    loss, stats = grpo.loss(logp, logp.detach(), None, adv, mask, config, kl_per_token=kl_full)
    assert stats["kl/mean"] == pytest.approx(0.2) and stats["kl_loss"] == pytest.approx(0.5 * 0.2)
    loss.backward()
    assert torch.allclose(kl_full.grad, torch.full((1, 2), 0.5 / 2))


def test_kl_share_against_the_policy_term():
    # clipped example (bnpo): pg_loss = -0.16. With ref = old, k3 of seq 0 token r: (1/r) + log r - 1,
    # weighted by r: 1 + r log r - r -> r = 1: 0, 1.5: 1 + 1.5 * 0.405465 - 1.5 = 0.108198, 0.5: 0.153426;
    # seq 1: r = 0.5: 0.153426, r = 1.1: 1 + 1.1 * 0.0953102 - 1.1 = 0.0048412. Sum 0.419891, / 5 = 0.0839782.
    logp, old, adv, mask = clipped_example()
    ref = old.clone()
    _, stats = grpo.loss(logp, old, ref, adv, mask, cfg(aggregation="bnpo", beta=1.0))
    assert stats["kl/mean"] == pytest.approx(0.0839782, abs=1e-6)
    assert stats["kl_share"] == pytest.approx(0.0839782 / (0.16 + 0.0839782), abs=1e-5)
    assert stats["loss"] == pytest.approx(-0.16 + 0.0839782, abs=1e-6)
    # with an entropy bonus of 0.1 * 7 / 5 = 0.14 (see the entropy test) in the denominator too
    entropy = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.0]])
    _, stats = grpo.loss(logp, old, ref, adv, mask, cfg(aggregation="bnpo", beta=1.0, entropy_coef=0.1),
                         entropy=entropy)
    assert stats["kl_share"] == pytest.approx(0.0839782 / (0.16 + 0.0839782 + 0.14), abs=1e-5)


def test_without_kl_input_there_is_no_kl_mean():
    logp, old, adv, mask = clipped_example()
    _, stats = grpo.loss(logp, old, None, adv, mask, cfg())
    assert "kl/mean" not in stats and stats["kl_loss"] == 0.0 and stats["kl_share"] == 0.0


# ---------------------------------------------------------------- entropy, truncation

def test_entropy_bonus_lowers_the_loss_and_pushes_entropy_up():
    logp, old, adv, mask = clipped_example()
    entropy = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, NAN]], requires_grad=True)
    config = cfg(aggregation="bnpo", entropy_coef=0.1)
    loss, stats = grpo.loss(logp, old, None, adv, mask, config, entropy=entropy)
    assert stats["entropy"] == pytest.approx(7.0 / 5)               # (1 + 2 + 3 + 0.5 + 0.5) / 5
    assert stats["entropy_loss"] == pytest.approx(-0.1 * 7.0 / 5)
    assert loss.item() == pytest.approx(-0.16 - 0.14, abs=1e-6)
    loss.backward()
    # a negative gradient: gradient descent raises the entropy of every loss token
    assert torch.allclose(entropy.grad, torch.tensor([[-0.02] * 3, [-0.02, -0.02, 0.0]]))


def test_entropy_without_coefficient_is_only_measured():
    logp, old, adv, mask = clipped_example()
    entropy = torch.ones(2, 3)
    loss, stats = grpo.loss(logp, old, None, adv, mask, cfg(aggregation="bnpo"), entropy=entropy)
    assert loss.item() == pytest.approx(-0.16) and stats["entropy"] == 1.0 and stats["entropy_loss"] == 0.0


def test_truncated_completions_are_masked():
    logp, old, adv, mask = clipped_example()
    truncated = torch.tensor([False, True])
    masked_cfg = cfg(aggregation="bnpo", mask_truncated=True)
    loss, stats = grpo.loss(logp, old, None, adv, mask, masked_cfg, truncated=truncated)
    assert loss.item() == pytest.approx(-2.7 / 3)                   # only seq 0's three tokens
    assert stats["clip_frac/low"] == 0.0 and stats["clip_frac/high"] == pytest.approx(1 / 3)
    # grpo keeps the truncated sequence in its count of sequences (it adds 0), as TRL does: -0.9 / 2
    loss, _ = grpo.loss(logp, old, None, adv, mask, cfg(aggregation="grpo", mask_truncated=True), truncated=truncated)
    assert loss.item() == pytest.approx(-0.45)
    # off by default: the flag decides, the tensor alone does not
    loss, _ = grpo.loss(logp, old, None, adv, mask, cfg(aggregation="bnpo"), truncated=truncated)
    assert loss.item() == pytest.approx(-0.16)
    with pytest.raises(ValueError, match="pass `truncated`"):
        grpo.loss(logp, old, None, adv, mask, masked_cfg)


def test_all_tokens_masked_gives_a_zero_loss_that_still_backpropagates():
    logp, old, adv, mask = clipped_example()
    loss, stats = grpo.loss(logp, old, None, adv, torch.zeros_like(mask), cfg())
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2, 3)) and stats["clip_frac"] == 0.0


# ---------------------------------------------------------------- gradient accumulation

@pytest.mark.parametrize("aggregation", ["dapo", "grpo", "dr_grpo"])
def test_micro_batches_with_the_global_normalizer_sum_to_the_full_batch_loss(aggregation):
    torch.manual_seed(1)
    n, t = 6, 5
    old = -torch.rand(n, t) * 2
    logp = (old + (torch.rand(n, t) - 0.5)).requires_grad_()
    ref = old - torch.rand(n, t) * 0.3
    entropy = torch.rand(n, t, requires_grad=True)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = torch.arange(t)[None, :] < lengths[:, None]
    truncated = torch.tensor([False, False, False, False, False, True])
    adv = torch.randn(n)
    config = cfg(aggregation=aggregation, beta=0.05, entropy_coef=0.01, mask_truncated=True)
    extra = {"max_completion_length": 8}

    full, _ = grpo.loss(logp, old, ref, adv, mask, config, entropy=entropy, truncated=truncated, **extra)
    full_grads = torch.autograd.grad(full, (logp, entropy))

    norm = grpo.global_normalizer(mask, config, truncated=truncated, **extra)
    expected_norm = {"dapo": 5 + 1 + 3 + 4 + 2, "grpo": 6, "dr_grpo": 6 * 8}[aggregation]  # truncated row excluded
    assert norm == expected_norm
    total = 0.0
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):  # uneven micro-batches
        part, _ = grpo.loss(logp[rows], old[rows], ref[rows], adv[rows], mask[rows], config,
                            entropy=entropy[rows], truncated=truncated[rows], normalizer=norm)
        total = total + part
    accumulated_grads = torch.autograd.grad(total, (logp, entropy))
    assert total.item() == pytest.approx(full.item(), abs=1e-6)
    for got, want in zip(accumulated_grads, full_grads):
        assert torch.allclose(got, want, atol=1e-7)


def test_bnpo_has_no_global_normalizer():
    with pytest.raises(ValueError, match="use 'dapo'"):
        grpo.global_normalizer(torch.ones(2, 3), cfg(aggregation="bnpo"))


# ---------------------------------------------------------------- beta controller

def run(controller: BetaController, kls) -> list[float]:
    betas = []
    for kl in kls:
        betas.append(controller.beta)
        controller.update(kl)
    return betas


def test_fixed_beta():
    assert run(BetaController(cfg(beta=0.04)), [0.5, 0.0, 9.0]) == [0.04] * 3


def test_warmup_then_linear_ramp():
    controller = BetaController(cfg(beta=0.1, beta_schedule="warmup", beta_warmup_steps=2, beta_ramp_steps=2))
    assert run(controller, [None] * 5) == pytest.approx([0.0, 0.0, 0.05, 0.1, 0.1])
    jump = BetaController(cfg(beta=0.1, beta_schedule="warmup", beta_warmup_steps=2))
    assert run(jump, [None] * 3) == [0.0, 0.0, 0.1]


def test_adaptive_beta_follows_the_kl_target():
    config = cfg(beta=0.1, beta_schedule="adaptive", kl_target=0.01, kl_horizon=10)
    # kl 0.02: error 1.0 clipped to 0.2 -> x1.02; kl 0.009: error -0.1 -> x0.99; kl 0.01: error 0 -> x1
    assert run(BetaController(config), [0.02, 0.009, 0.01, 0.0]) == pytest.approx([0.1, 0.102, 0.10098, 0.10098])
    with pytest.raises(ValueError, match="finite mean KL"):
        BetaController(config).update(None)


def test_adaptive_beta_is_clamped():
    high = BetaController(cfg(beta=0.1, beta_schedule="adaptive", kl_horizon=10, beta_max=0.101))
    assert run(high, [1.0, 1.0]) == pytest.approx([0.1, 0.101])        # 0.102 clamped to 0.101
    low = BetaController(cfg(beta=0.1, beta_schedule="adaptive", kl_horizon=10, beta_min=0.099))
    assert run(low, [0.0, 0.0]) == pytest.approx([0.1, 0.099])         # 0.098 clamped to 0.099


@pytest.mark.parametrize("overrides", [
    {"beta": 0.1, "beta_schedule": "adaptive", "kl_target": 0.01, "kl_horizon": 3},
    {"beta": 0.1, "beta_schedule": "warmup", "beta_warmup_steps": 3, "beta_ramp_steps": 4},
])
def test_beta_controller_state_round_trip_is_exact(overrides):
    kls = [0.013, 0.002, 0.05, 0.011, 0.007, 0.03, 0.0101, 0.004]
    first = BetaController(cfg(**overrides))
    run(first, kls[:4])
    resumed = BetaController(cfg(**overrides))
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as a checkpoint stores it
    assert run(resumed, kls[4:]) == run(first, kls[4:])                # bit-identical, not approx
    assert resumed.state_dict() == first.state_dict()


def test_beta_controller_state_from_another_schedule_is_refused():
    state = BetaController(cfg(beta=0.1)).state_dict()
    with pytest.raises(ValueError, match="resume with the run's own beta_schedule"):
        BetaController(cfg(beta=0.1, beta_schedule="adaptive")).load_state_dict(state)


# ---------------------------------------------------------------- parity with TRL's GRPOTrainer
#
# TRL computes the loss in GRPOTrainer._compute_loss(model, inputs), which gets the policy's token log-probs
# from self._get_per_token_logps_and_entropies. We build a real GRPOTrainer (a tiny random GPT-2 saved to a
# temporary directory, no download) and replace only that one method on the instance so that it returns our
# tensors; everything else -- ratio, clipping, KL, aggregation, metrics -- is TRL's own code.

N, T, MAX_LEN = 6, 5, 7


@pytest.fixture(scope="module")
def trl_trainer_factory(tmp_path_factory):
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    root = tmp_path_factory.mktemp("trl")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<eos>": 0, "a": 1}, "<eos>")),
                                        eos_token="<eos>", pad_token="<eos>")
    GPT2LMHeadModel(GPT2Config(vocab_size=2, n_positions=16, n_embd=8, n_layer=1, n_head=1,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(root / "model")
    cache = {}

    def make(**args):
        key = tuple(sorted(args.items()))
        if key not in cache:
            trl_args = TRLConfig(output_dir=str(root / f"run{len(cache)}"), report_to="none", use_cpu=True,
                                 per_device_train_batch_size=N, num_generations=2, max_completion_length=MAX_LEN,
                                 save_strategy="no", **args)
            trainer = GRPOTrainer(model=str(root / "model"), args=trl_args,
                                  reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                  train_dataset=Dataset.from_dict({"prompt": ["a"] * N}), processing_class=tokenizer)
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one micro-batch here
            cache[key] = trainer
        return cache[key]

    return make


def parity_tensors():
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(N, T, generator=g) * 3
    logp = old + (torch.rand(N, T, generator=g) - 0.5) * 1.2   # ratios in [0.55, 1.82]: both clips active
    ref = old - torch.rand(N, T, generator=g) * 0.5
    entropy = torch.rand(N, T, generator=g) * 2
    mask = torch.arange(T)[None, :] < torch.tensor([5, 3, 4, 1, 5, 2])[:, None]
    rewards = torch.tensor([[1.0, 0.0], [0.2, 0.7], [0.5, 0.4]])
    adv = grpo.advantages(rewards, cfg()).values.flatten()
    return logp, old, ref, entropy, mask, adv


def trl_loss(trainer, logp_leaf, old, ref, entropy, mask, adv):
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp_leaf, entropy, None)
    inputs = {
        "prompt_ids": torch.ones(N, 1, dtype=torch.long), "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return trainer._compute_loss(trainer.model, inputs)


# (loss_type, beta, use_bias_correction_kl, entropy_coef, epsilon_high). TRL takes the entropy bonus as a token mean
# whatever the loss type; ours is aggregated like the other terms, which coincides with TRL for bnpo and dapo only.
PARITY_CASES = [(loss_type, *case) for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo")
                for case in ((0.0, True, 0.0, 0.2), (0.04, True, 0.0, 0.2), (0.04, False, 0.0, 0.28))]
PARITY_CASES += [("bnpo", 0.04, True, 0.05, 0.28), ("dapo", 0.04, True, 0.05, 0.28)]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("loss_type, beta, bias_correction, entropy_coef, eps_high", PARITY_CASES)
def test_loss_matches_trl(trl_trainer_factory, loss_type, beta, bias_correction, entropy_coef, eps_high):
    trainer = trl_trainer_factory(loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=eps_high,
                                  use_bias_correction_kl=bias_correction, entropy_coef=entropy_coef)
    logp, old, ref, entropy, mask, adv = parity_tensors()

    theirs_logp = logp.clone().requires_grad_()
    theirs = trl_loss(trainer, theirs_logp, old, ref, entropy, mask, adv)
    theirs.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    config = cfg(aggregation=loss_type, beta=beta, eps_low=0.2, eps_high=eps_high,
                 kl_importance_weight=bias_correction, entropy_coef=entropy_coef)
    ours_logp = logp.clone().requires_grad_()
    ours, stats = grpo.loss(ours_logp, old, ref if beta else None, adv, mask, config, entropy=entropy,
                            max_completion_length=MAX_LEN)
    ours.backward()

    assert stats["clip_frac/low"] > 0 and stats["clip_frac/high"] > 0     # the clip is exercised
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(ours_logp.grad, theirs_logp.grad, atol=1e-7)
    assert stats["clip_frac/low"] == pytest.approx(metrics["clip_ratio/low_mean"])
    assert stats["clip_frac/high"] == pytest.approx(metrics["clip_ratio/high_mean"])
    assert stats["entropy"] == pytest.approx(metrics["entropy"])
    if beta:
        assert stats["kl/mean"] == pytest.approx(metrics["kl"])

