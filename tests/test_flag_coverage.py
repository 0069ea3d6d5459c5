"""Every flag of `rookworld train` changes what the trainer does.

For each flag, a run's configs with the flag at a value other than its default are compared with the same
configs at the default (both with the companions the flag needs, e.g. `--beta-schedule adaptive` for
`--kl-target`): something the trainer derives from them must differ. The probes are the trainer's own
functions on small real inputs (the tiny model and fixture rows of test_train): the rollout's settings, the
first batch of prompts, the rewards of fixed completions, the advantages of fixed rewards, the loss of fixed
log-probs, two optimizer steps on a fixed batch, the learning-rate and beta schedules, the evaluation and
checkpoint plan, the guards' decisions, the files a run writes and the hardware it takes. A flag that no
probe sees is reported, and so is a flag with no entry here: a new flag must say how it shows.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from test_train import tiny_run_inputs  # noqa: F401 (the fixture: a tiny random model and real data rows)

from rookworld import checkpoint, grpo, step, train, training
from rookworld.errors import UserError
from rookworld.log import RunLogger
from rookworld.model import SharedPrompts, token_logprobs
from rookworld.rewards import RewardConfig, score_batch, weights_at
from rookworld.rollout import Batch, Group, GroupSummary, completion_limits
from rookworld.runtime import Dist, default_cpu_threads, fast_path, pick_device

pytestmark = pytest.mark.stockfish

# flag's field -> (its companions, set in both configs; the flag's non-default value)
VARIANTS: dict[str, tuple[dict, object]] = {
    # TrainConfig (the base is the tiny model and data: `model` is compared with the embedded model, `data` with
    # the same rows in another order)
    "model": ({}, None), "data": ({}, "rows reversed"), "out": ({}, "elsewhere"), "steps": ({}, 7), "seed": ({}, 1),
    "batch_size": ({}, 5), "group_size": ({}, 3), "p_fraction": ({}, 0.25), "rollout_chunk": ({}, 2),
    "micro_batch_size": ({}, 3), "num_iterations": ({}, 2), "temperature_p": ({}, 0.7), "temperature_a": ({}, 0.7),
    "top_p_p": ({}, 0.9), "top_p_a": ({}, 0.9), "max_new_tokens_p": ({}, 20), "max_new_tokens_a": ({}, 20),
    "lr": ({}, 1e-3), "lr_schedule": ({}, "cosine"), "min_lr_ratio": ({"lr_schedule": "cosine"}, 0.5),
    "warmup_steps": ({}, 2), "weight_decay": ({}, 0.1), "beta1": ({}, 0.5), "beta2": ({}, 0.5),
    "grad_clip": ({}, 1e-9), "zero_std": ({}, "keep"), "resample_rounds": ({}, 0), "draft_a": ({}, False),
    "kl_max": ({}, 0.1), "reward_drop": ({}, 0.1), "lr_backoff": ({}, 0.25), "max_rollbacks": ({}, 1),
    "eval_every": ({}, 2), "eval_limit": ({}, 1), "eval_draws": ({}, 0), "eval_sampled_limit": ({}, 1),
    "eval_temperature": ({}, 0.5), "eval_self_play": ({}, 0), "eval_world_games": ({}, 1),
    "checkpoint_every": ({}, 2), "keep_last": ({}, 0),
    "overfit_single_batch": ({}, True), "device": ({}, "cpu:0"), "threads": ({}, default_cpu_threads() + 1),
    "ref_device": ({"kl_estimator": "full"}, "meta"), "fast_decode": ({}, True),
    "processes": ({}, (os.cpu_count() or 1) + 1), "engine_rewards": ({}, False), "p_truth": ({}, "engine"),
    "log_samples": ({}, 1), "tensorboard": ({}, False), "wandb_project": ({}, "rookworld-test"),
    # GRPOConfig
    "baseline": ({}, "rloo"), "ema_momentum": ({"baseline": "ema"}, 0.5), "std_scaling": ({}, "batch"),
    "std_floor": ({}, 0.5), "adv_clip": ({}, 0.5), "aggregation": ({}, "grpo"), "eps_low": ({}, 0.1),
    "eps_high": ({}, 0.28), "beta": ({}, 0.1), "beta_a_scale": ({}, 1.0), "learn_a": ({}, False),
    "kl_estimator": ({}, "k1"), "kl_direction": ({"kl_estimator": "full"}, "forward"),
    "kl_importance_weight": ({}, False), "beta_schedule": ({}, "adaptive"),
    "beta_warmup_steps": ({"beta_schedule": "warmup"}, 3), "beta_ramp_steps": ({"beta_schedule": "warmup"}, 3),
    "kl_target": ({"beta_schedule": "adaptive"}, 0.1), "kl_horizon": ({"beta_schedule": "adaptive"}, 2.0),
    "beta_min": ({"beta_schedule": "adaptive"}, 0.019), "beta_max": ({"beta_schedule": "adaptive"}, 0.021),
    "entropy_coef": ({}, 0.01), "mask_truncated": ({}, True),
    # RewardConfig (its P weights sum to 1: each weight's variant moves 0.1 from or to another, in WEIGHT_PAIRS)
    "p_best_move_weight": ({}, 0.6), "p_candidates_weight": ({}, 0.3), "p_evals_weight": ({}, 0.3),
    "p_format_weight": ({}, 0.0),
    "best_move_shape": ({}, "linear"), "best_move_scale": ({}, 0.5), "best_move_illegal": ({}, -1.0),
    "reward_warmup_steps": ({}, 5),
}
WEIGHT_PAIRS = {"p_best_move_weight": {"p_format_weight": 0.0}, "p_candidates_weight": {"p_format_weight": 0.0},
                "p_evals_weight": {"p_format_weight": 0.0}, "p_format_weight": {"p_evals_weight": 0.3}}
CLASSES = (train.TrainConfig, grpo.GRPOConfig, RewardConfig)


def _configs(base: train.TrainConfig, values: dict) -> tuple:
    """The run's three configs: `base` and the defaults, with `values` set where each field lives."""
    parts = [{k: v for k, v in values.items() if k in {f.name for f in fields(cls)}} for cls in CLASSES]
    return replace(base, **parts[0]), grpo.GRPOConfig(**parts[1]), RewardConfig(**parts[2])


@functools.cache
def _data(data: str, eval_limit: int, eval_every: int):
    return train.load_data(train.TrainConfig(data=data, eval_limit=eval_limit, eval_every=eval_every))


@functools.cache
def _model(model: str | None):
    from rookworld.hub import load_model, resolve_default_model

    return load_model(model or str(resolve_default_model()))


@functools.cache
def _engines(processes: int | None) -> int:
    from rookworld.stockfish import StockfishPool

    with StockfishPool(processes=processes) as pool:
        return len(pool._engines)


@functools.cache
def _reference(model: str | None, device: str, ref_device: str | None, kl_estimator: str, beta: bool) -> str | None:
    """Where the trainer puts its reference model, or why it refuses to."""
    cfg = train.TrainConfig(model=model, ref_device=ref_device)
    try:
        reference = train.load_reference(cfg, grpo.GRPOConfig(kl_estimator=kl_estimator, beta=0.02 * beta), device)
    except UserError as error:
        return str(error)
    return None if reference is None else str(reference.wte.weight.device)


def _limits(cfg) -> dict[str, int]:
    policy, tokenizer = _model(cfg.model)
    return completion_limits({"P": cfg.max_new_tokens_p, "A": cfg.max_new_tokens_a}, tokenizer,
                             _data(cfg.data, cfg.eval_limit, cfg.eval_every)[0], policy.config.n_positions)


def rollout(cfg, gcfg, rcfg):
    settings = step.rollout_config(cfg, rcfg, _limits(cfg), Dist())
    return {f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "reward"}


def prompts(cfg, gcfg, rcfg):
    return [s.prompt for s in train.batch_sampler(cfg, _data(cfg.data, 1, 0)[0]).next(cfg.batch_size)]


def rewards(cfg, gcfg, rcfg):
    rows = [s for s in _data(cfg.data, 1, 0)[0] if s.task == "P"][:6]
    broken = [text.rsplit("B:", 1)[0] + f"B: {move}" for text, move in
              zip((s.target for s in rows), ("a1a1", *(s.analysis.moves[-1] for s in rows[1:])))]
    scores = score_batch([(s.prompt, t, s.analysis) for s, t in zip(rows, broken)], None, rcfg)
    return [score.reward for score in scores], weights_at(rcfg, 1)


def _summary(task: str, values: list[float]) -> GroupSummary:
    return GroupSummary(task, values, [{}] * len(values), [5] * len(values), [False] * len(values))


def advantages(cfg, gcfg, rcfg):
    ema = train.make_baseline(gcfg)
    steps = [[_summary("P", [1.0, 0.0, 0.5, 0.5]), _summary("A", [1.0, 0.0, 1.0, 1.0]),
              _summary("P", [0.3, 0.3001, 0.3, 0.3]), _summary("A", [0.9, 0.9, 0.9, 0.9])],
             [_summary("P", [0.2, 0.9, 0.2, -0.8]), _summary("A", [1.0, 1.0, 0.5, 1.0]),
              _summary("P", [0.6, 0.6, 0.6, 0.6]), _summary("A", [0.0, 1.0, 0.2, 0.4])]]
    found = []
    for summaries in steps:
        adv = step.step_advantages(summaries, gcfg, ema)
        found.append((adv.values.tolist(), step.learning_groups(summaries, adv, cfg)))
    return found, None if ema is None else ema.means


def loss(cfg, gcfg, rcfg):
    """The loss of fixed log-probs whose ratios spread around 1, A and P rows, one truncated."""
    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=generator) * 3
    old = logp + (torch.rand(4, 5, generator=generator) - 0.5)
    ref = logp + (torch.rand(4, 5, generator=generator) - 0.5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    full = gcfg.kl_estimator == "full"
    _, stats = grpo.loss(logp, old, None if full else ref, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask, gcfg,
                         kl_per_token=(logp - ref).abs() if full else None,
                         entropy=torch.rand(4, 5, generator=generator), truncated=torch.tensor([0, 0, 1, 0]).bool(),
                         max_completion_length=5, kl_weight=torch.tensor([1.0, gcfg.beta_a_scale, 1.0, 1.0]))
    return stats


def _tiny_batch(tokenizer) -> Batch:
    generator = torch.Generator().manual_seed(1)
    completions = torch.randint(1, tokenizer.vocab_size, (8, 6), generator=generator)
    prompts_ = SharedPrompts(torch.randint(1, tokenizer.vocab_size, (2, 7), generator=generator),
                             torch.tensor([7, 4]), torch.tensor([0] * 4 + [1] * 4))
    mask = torch.arange(6) < torch.tensor([6, 5, 4, 6, 3, 6, 6, 2])[:, None]
    return Batch(prompts_, completions, mask, -torch.rand(8, 6, generator=generator) * 4,
                 torch.tensor([True] * 7 + [False]), torch.tensor([1.0, -1.0, 0.5, -0.5] * 2),
                 torch.ones(8), torch.tensor([False] * 4 + [True] * 4))


def update(cfg, gcfg, rcfg):
    """Two optimizer steps of the trainer's update on a fixed batch: the weights after, the steps' stats, the
    micro-batches; the full KL of the batch where the estimator is 'full'."""
    model, tokenizer = _model(cfg.model)
    policy = copy.deepcopy(model)
    reference = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    batch = _tiny_batch(tokenizer)
    optimizer = training.make_optimizer(policy, cfg)
    state = train.RunState()
    stats = []
    for _ in range(2):
        train.set_lr(optimizer, cfg, state)
        stats.append(step.policy_update(policy, reference, optimizer, batch, gcfg, cfg, gcfg.beta, 6, Dist()))
        state.step += 1
    full_kl = None
    if gcfg.kl_estimator == "full":
        full_kl = token_logprobs(policy, batch.completions, batch.completion_mask, prompts=batch.prompts,
                                 reference=reference, kl=True, kl_direction=gcfg.kl_direction).kl.sum().item()
    return ([p.detach().sum().item() for p in policy.parameters()], stats,
            len(list(batch.micro_batches(cfg.micro_batch_size))), full_kl)


def schedules(cfg, gcfg, rcfg):
    controller, betas = grpo.BetaController(gcfg), []
    for kl in (0.5,) * 6 + (0.001,) * 12 + (0.012,) * 3:
        betas.append(controller.beta)
        controller.update(kl)
    return [training.lr_factor(cfg, s) for s in range(cfg.steps)], betas


def plan(cfg, gcfg, rcfg):
    evals = train.eval_plan(cfg, _data(cfg.data, cfg.eval_limit, cfg.eval_every)[1])
    return ({prefix: (config, [s.prompt for s in samples]) for prefix, (config, samples) in evals.items()},
            [s for s in range(1, cfg.steps + 1) if training.eval_due(cfg, s)],
            [s for s in range(1, cfg.steps + 1) if training.checkpoint_due(cfg, s)])


def guards(cfg, gcfg, rcfg):
    history = [0.8] * 10 + [0.5] * 5
    reasons = [train.runaway_reason(cfg, {"kl/mean": 0.5}, train.RunState()),
               train.runaway_reason(cfg, {}, train.RunState(reward_history=history))]
    state = train.RunState()
    stops = [train.count_rollback(cfg, state) for _ in range(3)]
    return reasons, stops, state.lr_scale, train.inactive_kl_guard(cfg, gcfg)


def hardware(cfg, gcfg, rcfg):
    threads = torch.get_num_threads()
    try:
        device = pick_device(cfg.device, cfg.threads)
        taken = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    try:
        fast = fast_path(cfg.fast_decode, device)
    except UserError as error:
        fast = str(error)
    reference = _reference(cfg.model, device, cfg.ref_device, gcfg.kl_estimator, gcfg.beta > 0)
    return device, taken, fast, reference, _engines(cfg.processes)


def _write_model(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.txt").write_text("weights")


def files(cfg, gcfg, rcfg, root: Path):
    """What a run writes: its logs (one step, a few sample rows) and the checkpoints its plan keeps."""
    out = root / cfg.out
    groups = [Group(sample, None, None, None, None, None, ["c"], [0.0], [{}], 1.0)
              for sample in _data(cfg.data, 1, 0)[0][:6]]
    try:
        with RunLogger(out, {"train": {}}, tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project) as logger:
            logger.log(1, {"reward/mean": 0.0})
            logger.log_samples(1, train.sample_rows(groups, cfg.log_samples, Dist()))
    except UserError as error:
        return str(error)
    for s in range(1, 6):
        if training.checkpoint_due(replace(cfg, steps=5), s):
            checkpoint.save(out, s, {"run": {}}, _write_model, keep_last=cfg.keep_last)
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if "tensorboard" not in p.parts[-2:])
    samples = (out / "samples.jsonl").read_text().count("\n")
    return written, samples, (out / "tensorboard").exists()


PROBES = (prompts, rollout, rewards, advantages, loss, schedules, plan, guards, hardware, update)
_DEFAULTS: dict[tuple[str, str], object] = {}  # each probe's result at the default, by its companions


def _train_fields() -> set[str]:
    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    return {action.dest for action in parser._actions if action.option_strings} - {"help", "config", "resume"}


def test_every_train_flag_has_a_variant_here():
    assert set(VARIANTS) == _train_fields()


@pytest.mark.parametrize("flag", sorted(VARIANTS))
def test_each_train_flag_changes_what_the_trainer_does(flag, tiny_run_inputs, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("WANDB_MODE", "disabled")
    model_dir, data = tiny_run_inputs
    base = train.TrainConfig(model=str(model_dir), data=str(data), out="run")
    companions, value = VARIANTS[flag]
    if flag == "data":
        value = str(tmp_path / "reversed.txt")
        Path(value).write_text("\n".join(reversed(data.read_text().splitlines())) + "\n")
    default = _configs(base, companions)
    changed = _configs(base, {**companions, **WEIGHT_PAIRS.get(flag, {}), flag: value})
    assert getattr(next(c for c in changed if flag in {f.name for f in fields(c)}), flag) == value
    for probe in PROBES:
        key = (probe.__name__, repr(sorted(companions.items())))
        if key not in _DEFAULTS:
            _DEFAULTS[key] = probe(*default)
        if _DEFAULTS[key] != probe(*changed):
            return
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert files(*default, tmp_path / "a") != files(*changed, tmp_path / "b"), f"--{flag} changed nothing"
