"""The GRPO trainer end to end on a tiny model: smoke run, exact resume, NaN guard, 2-process DDP, bad input."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import one_error_line
from safetensors.torch import load_file

from rookworld import checkpoint, cli, grpo, rollout, runtime, step, train
from rookworld.model import GPT, GPTConfig
from rookworld.rewards import RewardConfig

pytestmark = pytest.mark.stockfish


@pytest.fixture(scope="module")
def tiny_run_inputs(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny random checkpoint with a byte-level tokenizer, and a data file of real fixture rows."""
    from conftest import FIXTURES as fixtures_dir

    from rookworld.hub import save_model
    from rookworld.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("train_inputs")
    p_lines = (fixtures_dir / "rook_val_sample.txt").read_text().splitlines()[:40]
    a_rows = json.loads((fixtures_dir / "a_task_openings_sample.json").read_text())[:40]
    data = root / "data.txt"
    from rookworld.data.record import a_sample

    a_lines = [s.prompt[3:] + s.target for s in (a_sample(r["prompt"]) for r in a_rows)]  # hub layout: no "A: "
    data.write_text("\n".join(p_lines + a_lines) + "\n")
    tokenizer = Tokenizer.train_chess(p_lines + a_lines, vocab_size=257)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_positions=256, n_embd=32, n_layer=2, n_head=2))
    save_model(model, tokenizer, root / "model")
    return root / "model", data


def tiny_config(model: Path, data: Path, out: Path, **overrides) -> train.TrainConfig:
    base = train.TrainConfig(model=str(model), data=str(data), out=str(out), steps=3, batch_size=4, group_size=4,
                             rollout_chunk=2, micro_batch_size=6, lr=1e-3, eval_every=0, checkpoint_every=2,
                             max_new_tokens_p=24, max_new_tokens_a=24, processes=1, tensorboard=False,
                             kl_max=0, reward_drop=0, zero_std="keep", threads=1)
    # threads=1: float reductions (and so the sampled ids) do not depend on the machine's core count.
    # A random tiny model gets equal rewards in most groups; the entropy bonus keeps gradients non-zero.
    return replace(base, **overrides)


def rollout_cfg(cfg: train.TrainConfig, limits: dict[str, int]) -> rollout.RolloutConfig:
    """The rollout settings a one-process run of `cfg` samples and scores with at these completion limits."""
    return step.rollout_config(cfg, RewardConfig(), limits, runtime.Dist())


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoint-last" / "model.safetensors"))


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_smoke_run_changes_parameters_with_finite_losses(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)
    out = train.main(tiny_config(model_dir, data, tmp_path / "run"), gcfg)
    before, after = load_file(str(model_dir / "model.safetensors")), weights(out)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = records(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward/mean", "loss", "pg_loss", "kl/mean", "kl_share", "entropy", "clip_frac", "frac_zero_std",
                "grad_norm", "lr", "beta", "time/step", "completion/len_mean", "ratio/max"):
        assert all(key in r and r[key] is not None for r in rows), key
    assert all(r["ratio/max"] == 1.0 for r in rows)  # one pass over each batch: the ratio is 1 by construction
    assert all(abs(r["loss"]) < 1e3 for r in rows)
    assert (out / "samples.jsonl").read_text().strip()


LOSS_PATHS = {
    "grpo": ({"aggregation": "grpo"}, {}),
    "bnpo": ({"aggregation": "bnpo"}, {}),
    "dapo": ({"aggregation": "dapo"}, {}),
    "dr_grpo": ({"aggregation": "dr_grpo"}, {}),
    "two iterations": ({}, {"num_iterations": 2}),
    "full kl": ({"kl_estimator": "full"}, {}),
    "forward kl": ({"kl_estimator": "full", "kl_direction": "forward"}, {}),
    "symmetric kl": ({"kl_estimator": "full", "kl_direction": "symmetric"}, {}),
    "rloo baseline": ({"baseline": "rloo"}, {}),
    "ema baseline": ({"baseline": "ema", "std_scaling": "batch"}, {}),
    "one KL weight for both tasks": ({"beta_a_scale": 1.0}, {}),
    "A held by its KL alone": ({"learn_a": False}, {}),
    "mask truncated": ({"mask_truncated": True}, {"max_new_tokens_p": 120, "max_new_tokens_a": 60}),
    "batch std": ({"std_scaling": "batch"}, {}),
    "adaptive beta": ({"beta_schedule": "adaptive"}, {}),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", LOSS_PATHS)
def test_every_loss_path_takes_a_real_step(tiny_run_inputs, tmp_path, name):
    model_dir, data = tiny_run_inputs
    loss_options, run_options = LOSS_PATHS[name]
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01, **loss_options)
    out = train.main(tiny_config(model_dir, data, tmp_path / "run", steps=2, **run_options), gcfg)
    rows = records(out)
    assert all(r["update/applied"] == 1.0 and math.isfinite(r["loss"]) and r["guard/nonfinite"] == 0 for r in rows)
    before, after = load_file(str(model_dir / "model.safetensors")), weights(out)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    if name == "two iterations":
        assert all(r["ratio/mean"] == pytest.approx(1.0, abs=0.1) for r in rows)  # an update, then the ratio moves
        assert all(r["ratio/max"] > 1.0 for r in rows)
    if name == "mask truncated":
        assert all(r["completion/truncated_frac"] < 1.0 for r in rows)  # some completions ended: loss tokens left


def test_a_prompts_that_do_not_learn_keep_only_their_kl():
    """--learn-a false: the A groups' advantages are 0 (their completions carry only the KL term), the P groups'
    are unchanged, and which groups have equal rewards is still said (zero-std resampling draws as before)."""
    def summary(task, rewards):
        return rollout.GroupSummary(task, rewards, [{}] * len(rewards), [5] * len(rewards), [False] * len(rewards))
    summaries = [summary("P", [1.0, 0.0, 0.5, 0.5]), summary("A", [1.0, 0.0, 1.0, 1.0]),
                 summary("A", [1.0, 1.0, 1.0, 1.0]), summary("P", [0.2, 0.9, 0.2, 0.2])]
    learning = step.step_advantages(summaries, grpo.GRPOConfig(), None)
    holding = step.step_advantages(summaries, grpo.GRPOConfig(learn_a=False), None)
    assert learning.values[1].abs().sum() > 0 and torch.equal(holding.values[1:3], torch.zeros(2, 4))
    assert torch.equal(holding.values[[0, 3]], learning.values[[0, 3]])
    assert holding.zero_std.tolist() == learning.zero_std.tolist() == [False, False, True, False]


@pytest.mark.integration
def test_off_policy_sampling_is_scored_at_its_own_temperature(tiny_run_inputs, tmp_path):
    """Sampling at temperature != 1 and top-p < 1: the ratio's old log-probs (generation's) and the new ones
    (the update's) refer to the same tempered distribution, so before any update the ratio is 1."""
    from rookworld.hub import load_model
    from rookworld.model import token_logprobs

    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "run", temperature_p=0.6, top_p_p=0.85, temperature_a=1.4,
                      top_p_a=0.9, num_iterations=2, lr=1e-12, steps=1)
    policy, tokenizer = load_model(model_dir)
    samples = train.load_data(cfg)[0][::20][:4]
    assert {s.task for s in samples} == {"P", "A"}
    groups = rollout.rollout(policy, tokenizer, samples, rollout_cfg(cfg, {"P": 24, "A": 24}), 0, 0, None,
                             runtime.Dist(), {})
    batch = rollout.Batch.of(groups, [torch.zeros(cfg.group_size) for _ in groups])
    assert sorted(set(batch.temperature.tolist())) == pytest.approx([0.6, 1.4])
    for mb in batch.micro_batches(64):
        args = (policy, mb.completions, mb.completion_mask)
        at_temperature = token_logprobs(*args, prompts=mb.prompts, temperature=mb.temperature).logp
        assert (at_temperature - mb.logprobs).abs().max() < 1e-4
        assert (token_logprobs(*args, prompts=mb.prompts).logp - mb.logprobs).abs().max() > 0.01
    row = records(train.main(cfg, grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)))[0]
    assert row["ratio/mean"] == pytest.approx(1.0, abs=1e-4) and row["clip_frac"] == 0.0


def test_chunks_are_scored_on_a_second_thread_with_the_same_rewards(tiny_run_inputs, tmp_path, monkeypatch):
    """Scoring overlaps the next chunk's sampling: it runs off the main thread, and the groups are those
    of sampling and scoring each chunk in turn."""
    import threading

    from rookworld.hub import load_model

    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "run", rollout_chunk=2)
    policy, tokenizer = load_model(model_dir)
    samples = train.load_data(cfg)[0][::10][:6]
    limits = {"P": 24, "A": 24}
    threads = []
    score_chunk = rollout.score_chunk

    def recording(*args):
        threads.append(threading.current_thread() is threading.main_thread())
        return score_chunk(*args)

    monkeypatch.setattr(rollout, "score_chunk", recording)
    timings: dict[str, float] = {}
    settings = rollout_cfg(cfg, limits)
    groups = rollout.rollout(policy, tokenizer, samples, settings, 0, 0, None, runtime.Dist(), timings)
    assert threads == [False, False, False]  # three chunks of two prompts, none scored on the main thread
    assert {"time/generate", "time/reward", "time/reward_total"} <= set(timings)
    for c in range(3):
        part = samples[2 * c:2 * c + 2]
        gen, texts, sampled = rollout.sample_chunk(policy, tokenizer, part, settings,
                                                    rollout.chunk_generator(cfg.seed, 0, c, torch.device("cpu")))
        scores, _ = score_chunk(part, texts, settings, None)
        for mine, theirs in zip(groups[2 * c:2 * c + 2], rollout.chunk_groups(part, gen, texts, sampled, scores, 4)):
            assert torch.equal(mine.sequences, theirs.sequences) and mine.rewards == theirs.rewards


def test_engine_p_truth_scores_against_a_search_at_the_label_limit(tiny_run_inputs, tmp_path):
    from rookworld.rewards import score_batch
    from rookworld.stockfish import LABEL_LIMIT, StockfishPool

    model_dir, data = tiny_run_inputs
    stored = tiny_config(model_dir, data, tmp_path / "run")
    engine = replace(stored, p_truth="engine")
    samples = [s for s in train.load_data(stored)[0] if s.task == "P"][:2]
    texts = [s.target for s in samples for _ in range(stored.group_size)]  # the data's own labels
    with StockfishPool(processes=1) as pool:
        limits = {"P": 24, "A": 24}
        from_data, _ = rollout.score_chunk(samples, texts, rollout_cfg(stored, limits), pool)
        scores, _ = rollout.score_chunk(samples, texts, rollout_cfg(engine, limits), pool)
        searched = pool.analyse([s.fen for s in samples], LABEL_LIMIT)
        assert all(a.limit == "depth=10" for a in searched)
        expected = score_batch([(s.prompt, s.target, a) for s, a in zip(samples, searched)
                                for _ in range(stored.group_size)], pool)
    assert [s.reward for s in scores] == [s.reward for s in expected]
    assert [s.reward for s in scores] != [s.reward for s in from_data]  # depth 10 is another truth
    with pytest.raises(ValueError, match="p_truth 'engine' searches every P prompt"):
        replace(stored, p_truth="engine", engine_rewards=False)


def test_fast_decode_is_refused_off_cuda(tmp_path, capsys):
    code = cli.main(["train", "--fast-decode", "true", "--device", "cpu", "--out", str(tmp_path / "run")])
    assert code != 0 and "--fast-decode true needs a CUDA device" in capsys.readouterr().err


def test_a_torchrun_process_without_its_own_gpu_is_refused():
    from rookworld.runtime import rank_cuda_device

    assert rank_cuda_device(1, 2) == "cuda:1"
    with pytest.raises(train.UserError, match="process 1 of this node has no GPU .1 CUDA device.*--nproc-per-node"):
        rank_cuda_device(1, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fast", [True, False])
def test_cuda_steps_with_and_without_the_fast_path(tiny_run_inputs, tmp_path, fast):
    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "run", steps=2, device="cuda", fast_decode=fast, eval_every=2,
                      eval_limit=8, eval_draws=2, eval_sampled_limit=4)
    out = train.main(cfg, grpo.GRPOConfig(beta=0.05, entropy_coef=0.01))
    rows = records(out)
    assert all(r["update/applied"] == 1.0 and math.isfinite(r["loss"]) for r in rows)
    before, after = load_file(str(model_dir / "model.safetensors")), weights(out)
    assert any(not torch.equal(before[k], after[k].cpu()) for k in before)
    assert after["transformer.wte.weight"].dtype == torch.float32  # master weights stay fp32


def test_batch_holds_each_prompt_once_and_scores_as_sampled(tiny_run_inputs, tmp_path):
    """Prompts of different widths, left-padded by sampling: the Batch keeps each group's prompt once
    (its real tokens first) and the completions from their first token; log-probs over the shared prompts
    equal those of the left-padded rows. Micro-batches end at their longest row and hold only their
    rows' prompts; by_length only regroups the rows, groups longest completion first and kept together."""
    from rookworld.hub import load_model
    from rookworld.model import token_logprobs

    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "run")
    policy, tokenizer = load_model(model_dir)
    samples = train.load_data(cfg)[0]
    short, long = min(samples, key=lambda s: len(s.prompt)), max(samples, key=lambda s: len(s.prompt))
    groups = rollout.rollout(policy, tokenizer, [long, short], rollout_cfg(cfg, {"P": 24, "A": 24}), 0, 0, None,
                             runtime.Dist(), {})
    assert bool((~groups[1].attention_mask[:, 0]).all())  # the short prompt's rows start with padding
    batch = rollout.Batch.of(groups, [torch.arange(cfg.group_size, dtype=torch.float32) + 10 * i for i in range(2)])
    G = cfg.group_size
    assert batch.prompts.rows.tolist() == [0] * G + [1] * G
    assert batch.task_a.tolist() == [s.task == "A" for s in (long, short) for _ in range(G)]
    assert {long.task, short.task} == {"P", "A"}  # the longest prompt is an A prompt, the shortest a P prompt
    for i, (g, sample) in enumerate(zip(groups, (long, short))):
        length = int(batch.prompts.lengths[i])
        assert batch.prompts.ids[i, :length].tolist() == tokenizer.encode_prompts([sample.prompt])[0]
        assert not batch.prompts.ids[i, length:].any()  # right-padded with 0
        for r in range(G):
            n = int(g.completion_mask[r].sum())
            assert torch.equal(batch.completion_mask[i * G + r], torch.arange(batch.completions.shape[1]) < n)
            assert batch.completions[i * G + r, :n].tolist() == g.sequences[r][g.completion_mask[r]].tolist()

    with torch.no_grad():
        shared = token_logprobs(policy, batch.completions, batch.completion_mask, prompts=batch.prompts).logp
        for i, g in enumerate(groups):
            left = token_logprobs(policy, g.sequences, g.completion_mask, g.attention_mask).logp
            rows = slice(i * G, (i + 1) * G)
            assert torch.allclose(left[g.completion_mask], shared[rows][batch.completion_mask[rows]], atol=1e-5)

    lengths = batch.completion_mask.sum(1)
    size = G + 2  # micro-batches that mix the two prompts
    in_order = list(batch.micro_batches(size))
    assert [int(mb.completions.shape[1]) for mb in in_order] == [int(lengths[r:r + size].max())
                                                                 for r in range(0, 2 * G, size)]
    assert torch.equal(torch.cat([mb.advantages for mb in in_order]), batch.advantages)
    assert torch.equal(torch.cat([mb.task_a for mb in in_order]), batch.task_a)  # each row keeps its task
    assert [len(mb.prompts.lengths) for mb in in_order] == [2, 1]  # the second holds only the short prompt's rows
    assert torch.equal(in_order[1].prompts.lengths, batch.prompts.lengths[1:])
    longest_first = list(batch.micro_batches(size, by_length=True))
    first = int(lengths[G:].max() > lengths[:G].max())  # the group with the longest completion
    by_group = batch.advantages.view(2, G)
    expected = torch.cat([by_group[first], by_group[1 - first]])
    assert torch.equal(torch.cat([mb.advantages for mb in longest_first]), expected)


@pytest.mark.integration
def test_a_rows_are_sampled_from_their_labels_as_drafts(monkeypatch):
    """--draft-a (default true): the A prompts' labels are the drafts of speculative sampling, the P prompts have
    none; the shipped model reproduces most labels whole, its rows' log-probs are the model's, and with
    --draft-a false every row is decoded, to about as many exact rows."""
    from rookworld import generation
    from rookworld.hub import load_model, resolve_default_model
    from rookworld.model import token_logprobs

    cfg = train.TrainConfig(data="embedded", group_size=16, threads=1, processes=1)
    assert cfg.draft_a
    policy, tokenizer = load_model(resolve_default_model())
    samples = train.load_data(cfg)[0]
    part = [s for s in samples if s.task == "A"][:6] + [next(s for s in samples if s.task == "P")]
    limits, G = rollout.completion_limits({}, tokenizer, samples, policy.config.n_positions), cfg.group_size
    drafts_seen = []
    original = generation.generate_groups
    monkeypatch.setattr(rollout, "generate_groups",
                        lambda *a, **k: drafts_seen.append(k.get("drafts")) or original(*a, **k))
    exact = {}
    for draft in (True, False):
        settings = rollout_cfg(replace(cfg, draft_a=draft), limits)
        gen, texts, sampled = rollout.sample_chunk(policy, tokenizer, part, settings,
                                                   rollout.chunk_generator(0, 0, 0, torch.device("cpu")))
        exact[draft] = sum(t == part[r // G].target for r, t in enumerate(texts[:6 * G]))
        temperature = torch.tensor([sampled[r // G].temperature for r in range(len(texts))])
        recomputed = token_logprobs(policy, gen.sequences, gen.completion_mask, gen.attention_mask,
                                    temperature=temperature).logp
        assert (gen.logprobs - recomputed).abs().max() <= 1e-4
    labels = drafts_seen[0]
    assert [tokenizer.decode(d[:-1]) for d in labels[:6]] == [s.target for s in part[:6]] and labels[6] is None
    assert drafts_seen[1] is None
    assert exact[True] >= 0.75 * 6 * G and abs(exact[True] - exact[False]) <= 0.1 * 6 * G


@pytest.mark.integration
def test_the_reward_config_scores_the_rollouts_and_is_saved_with_the_run(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "default", steps=1, p_fraction=1.0, max_new_tokens_p=8)
    default = train.main(cfg, grpo.GRPOConfig())
    harsh = train.main(replace(cfg, out=str(tmp_path / "harsh")), grpo.GRPOConfig(),
                       rcfg=RewardConfig(best_move_illegal=-1.0))
    # 8 random tokens never name a legal B: move: the illegal credit of each config
    assert records(default)[0]["reward/P/best_move"] == RewardConfig().best_move_illegal
    assert records(harsh)[0]["reward/P/best_move"] == -1.0
    saved = json.loads((harsh / "config.json").read_text())
    assert saved["reward"]["best_move_illegal"] == -1.0 and set(saved) == {"train", "grpo", "reward"}


@pytest.mark.integration
def test_resample_replaces_zero_std_groups_with_new_prompts(tmp_path):
    # The embedded model gets most A prompts exactly right at every sample: many zero-std groups to replace.
    base = train.TrainConfig(data="embedded", steps=1, batch_size=4, group_size=4, p_fraction=0.0, eval_every=0,
                             checkpoint_every=1, processes=1, tensorboard=False)
    kept = records(train.main(replace(base, out=str(tmp_path / "keep"), zero_std="keep"), grpo.GRPOConfig()))[0]
    resampled = records(train.main(replace(base, out=str(tmp_path / "resample"), zero_std="resample",
                                           resample_rounds=3), grpo.GRPOConfig()))[0]
    assert kept["frac_zero_std"] >= 0.5
    assert resampled["frac_zero_std"] < kept["frac_zero_std"]


def straight_and_resumed(tiny_run_inputs, tmp_path: Path, gcfg: grpo.GRPOConfig, steps: int, stop: int,
                         **options) -> tuple[Path, Path]:
    """A run of `steps` steps, and the same run stopped after `stop` steps and resumed to `steps`."""
    model_dir, data = tiny_run_inputs
    straight = train.main(tiny_config(model_dir, data, tmp_path / "straight", steps=steps, **options), gcfg)
    first = train.main(tiny_config(model_dir, data, tmp_path / "split", steps=stop, **options), gcfg)
    resumed = train.main(tiny_config(model_dir, data, tmp_path / "split", steps=steps, **options), gcfg,
                         resume=str(first))
    return straight, resumed


@pytest.mark.parametrize("gcfg", [
    pytest.param(grpo.GRPOConfig(beta=0.05, beta_schedule="adaptive", kl_target=0.01, entropy_coef=0.01),
                 marks=pytest.mark.integration),
    grpo.GRPOConfig(beta=0.05, baseline="ema", ema_momentum=0.5, std_scaling="batch", entropy_coef=0.01),
], ids=["adaptive beta", "ema baseline"])
def test_resume_is_bit_identical(tiny_run_inputs, tmp_path, gcfg):
    straight, resumed = straight_and_resumed(tiny_run_inputs, tmp_path, gcfg, 4, 2, checkpoint_every=2)
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["reward/mean"] for r in records(straight)] == [r["reward/mean"] for r in records(resumed)]
    if gcfg.baseline == "ema":  # the averages travel in the checkpoint
        assert [r["baseline/P"] for r in records(straight)] == [r["baseline/P"] for r in records(resumed)]


def test_beta_a_scale_weighs_the_kl_of_the_a_rows_alone(tiny_run_inputs):
    """--beta-a-scale s: policy_update's KL term is P rows' KL + s times A rows' (Batch.task_a), each at beta."""
    import copy

    from rookworld.hub import load_model
    from rookworld.model import SharedPrompts

    model_dir, _ = tiny_run_inputs
    policy, tokenizer = load_model(str(model_dir))
    generator = torch.Generator().manual_seed(1)
    reference = copy.deepcopy(policy).requires_grad_(False)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    completions = torch.randint(1, tokenizer.vocab_size, (6, 10), generator=generator)
    prompts = SharedPrompts(torch.randint(1, tokenizer.vocab_size, (2, 8), generator=generator), torch.tensor([8, 5]),
                            torch.tensor([0, 0, 0, 1, 1, 1]))
    batch = rollout.Batch(prompts, completions, torch.ones_like(completions, dtype=torch.bool),
                        torch.zeros(completions.shape), torch.ones(6, dtype=torch.bool), torch.zeros(6),
                        torch.ones(6), torch.tensor([False] * 3 + [True] * 3))

    def kl_loss(scale: float) -> float:
        model = copy.deepcopy(policy)
        stats = step.policy_update(model, reference, torch.optim.SGD(model.parameters(), lr=0.0), batch,
                                    grpo.GRPOConfig(beta=0.1, beta_a_scale=scale), train.TrainConfig(grad_clip=0.0),
                                    0.1, 10, runtime.Dist())
        return stats["kl_loss"]

    p_part, both = kl_loss(0.0), kl_loss(1.0)
    assert p_part > 0 and both - p_part > 0  # each task's rows have a KL of their own
    assert kl_loss(3.0) == pytest.approx(p_part + 3 * (both - p_part), rel=1e-5)


@pytest.mark.integration
def test_resume_takes_the_adamw_flags_given(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)
    run = train.main(tiny_config(model_dir, data, tmp_path / "run", steps=2), gcfg)
    train.main(tiny_config(model_dir, data, run, steps=3, weight_decay=0.1, beta1=0.5, beta2=0.9), gcfg,
               resume=str(run))
    decayed, plain = checkpoint.load_state(run / checkpoint.LAST)["optimizer"]["param_groups"]
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.1, 0.0)  # as config.json says
    assert decayed["betas"] == plain["betas"] == (0.5, 0.9)
    assert json.loads((run / "config.json").read_text())["train"]["weight_decay"] == 0.1


@pytest.mark.integration
def test_resume_refuses_steps_already_taken_and_another_beta_schedule_before_any_work(tiny_run_inputs, tmp_path,
                                                                                      capsys):
    model_dir, data = tiny_run_inputs
    run = train.main(tiny_config(model_dir, data, tmp_path / "run", steps=2), grpo.GRPOConfig(beta=0.05))
    config = (run / "config.json").read_text()
    for flags, message in ((["--steps", "2"], f"--steps 2: {run} is already at step 2; give --steps > 2"),
                           (["--steps", "1"], f"--steps 1: {run} is already at step 2; give --steps > 2"),
                           (["--steps", "3", "--beta-schedule", "adaptive"],
                            f"--beta-schedule adaptive: --resume {run} continues the model it saved (its "
                            f"--beta-schedule: fixed)")):
        assert cli.main(["train", "--resume", str(run), *flags]) == 2
        assert message in one_error_line(capsys)
    assert (run / "config.json").read_text() == config  # it says the steps the run took


@pytest.mark.integration
def test_a_run_killed_before_its_first_checkpoint_starts_over_with_out(tiny_run_inputs, tmp_path, capsys):
    model_dir, data = tiny_run_inputs
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)
    straight = train.main(tiny_config(model_dir, data, tmp_path / "straight", steps=2), gcfg)
    killed = tmp_path / "killed"  # what a run killed before its first checkpoint leaves: its config and logs
    shutil.copytree(straight, killed, ignore=shutil.ignore_patterns("checkpoint-*"))
    with pytest.raises(train.UserError, match=f"no step to keep; start the run over with --out {killed}"):
        train.main(tiny_config(model_dir, data, killed, steps=2), gcfg, resume=str(killed))
    again = train.main(tiny_config(model_dir, data, killed, steps=2), gcfg)
    assert "starting it over (its logs are replaced)" in capsys.readouterr().err
    assert [(r["step"], r["reward/mean"]) for r in records(again)] == \
        [(r["step"], r["reward/mean"]) for r in records(straight)]
    a, b = weights(straight), weights(again)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(train.UserError, match=f"--out {killed}: holds a run that can be resumed"):
        train.main(tiny_config(model_dir, data, killed, steps=2), gcfg)  # now it has a checkpoint


@pytest.mark.integration
def test_the_kl_guard_says_at_the_start_that_it_is_inactive_while_beta_is_0(tiny_run_inputs, tmp_path, capsys):
    assert train.inactive_kl_guard(train.TrainConfig(), grpo.GRPOConfig()) is None
    assert train.inactive_kl_guard(train.TrainConfig(kl_max=0), grpo.GRPOConfig(beta=0)) is None
    assert train.inactive_kl_guard(train.TrainConfig(), grpo.GRPOConfig(beta=0)) == \
        "--kl-max 1.0 is inactive: with --beta 0 no KL is measured"
    model_dir, data = tiny_run_inputs
    warmup = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01, beta_schedule="warmup", beta_warmup_steps=1)
    run = train.main(tiny_config(model_dir, data, tmp_path / "run", steps=2, kl_max=1e-12, max_rollbacks=5), warmup)
    assert capsys.readouterr().err.count("--kl-max 1e-12 is inactive for the first 1 steps: beta is 0") == 1
    first, second = records(run)
    assert "kl/mean" not in first and "guard/rollback" not in first  # beta 0: no KL, no guard
    assert second["kl/mean"] > 1e-12 and second["guard/rollback"] == 1.0


@pytest.mark.integration
def test_ema_resume_needs_the_baseline_state(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    run = train.main(tiny_config(model_dir, data, tmp_path / "run", steps=1), grpo.GRPOConfig())
    with pytest.raises(train.UserError, match="holds no ema baseline state"):
        train.main(tiny_config(model_dir, data, tmp_path / "run", steps=2), grpo.GRPOConfig(baseline="ema"),
                   resume=str(run))


@pytest.mark.integration
def test_reward_warmup_scores_with_the_steps_weights_and_logs_them(tiny_run_inputs, tmp_path):
    from rookworld.rewards import WARMUP_WEIGHTS, WEIGHTS

    model_dir, data = tiny_run_inputs
    rcfg = RewardConfig(reward_warmup_steps=2)
    rows = records(train.main(tiny_config(model_dir, data, tmp_path / "run"), grpo.GRPOConfig(), rcfg=rcfg))
    configured = {"P": rcfg.p_weights, "A": WEIGHTS["A"]}
    for row, done in zip(rows, (0.0, 0.5, 1.0)):
        for task in ("P", "A"):
            weights = {name: (1 - done) * WARMUP_WEIGHTS[task][name] + done * w
                       for name, w in configured[task].items()}
            assert {n: row[f"reward_weight/{task}/{n}"] for n in weights} == pytest.approx(weights)
            # components lie in [-1, 1] and the weights sum to 1, so the mean reward is the weighted
            # sum of the mean components
            mixed = math.fsum(w * row[f"reward/{task}/{n}"] for n, w in weights.items())
            assert row[f"reward/{task}"] == pytest.approx(mixed, abs=1e-9)


@pytest.mark.integration
def test_held_out_eval_is_greedy_and_sampled_and_leaves_training_unchanged(tiny_run_inputs, tmp_path, capsys):
    model_dir, data = tiny_run_inputs
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)
    plain = train.main(tiny_config(model_dir, data, tmp_path / "plain"), gcfg)
    assert "eval step" not in capsys.readouterr().out
    evaluated = train.main(tiny_config(model_dir, data, tmp_path / "evaluated", eval_every=2, eval_limit=6,
                                       eval_draws=3), gcfg)
    evals = [json.loads(line) for line in (evaluated / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2, 3]  # every 2 steps and after the last
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("eval", "held-out"))]
    assert [line.split(" | ")[0] for line in printed[:3]] == ["eval step 0", "eval step 2", "eval step 3"]
    first, last = evals[0]["eval/P/acpl"], evals[-1]["eval/P/acpl"]
    assert printed[0].startswith(f"eval step 0 | P/acpl {first:.4g} ± ")
    assert printed[3].startswith(f"held-out change, step 0 → 3 (paired SE): P/acpl {first:.4g} → {last:.4g} (Δ ")
    assert "eval/P/acpl/delta/se" in evals[-1] and "eval/sampled/P/acpl/delta/se" in evals[-1]
    assert len(printed) == 4
    for e in evals:
        assert {"eval/reward/mean", "eval/sampled/reward/mean"} <= set(e)
        assert e["eval/selfplay/legal_half_moves/n"] == 64 and "eval/sampled/selfplay/legal_half_moves" not in e
    assert (evaluated / "checkpoint-best").is_dir()
    a, b = weights(plain), weights(evaluated)
    assert all(torch.equal(a[k], b[k]) for k in a)  # evaluation draws from its own random stream


@pytest.mark.integration
def test_periodic_eval_is_half_p_half_a_drawn_from_the_whole_split(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    _, evals = train.load_data(tiny_config(model_dir, "embedded", tmp_path / "run", eval_every=1, eval_limit=8))
    assert [s.task for s in evals] == ["P"] * 4 + ["A"] * 4
    _, few = train.load_data(tiny_config(model_dir, data, tmp_path / "run", eval_every=1, eval_limit=8))
    assert len(few) < 8 and {s.task for s in few} == {"P"}  # this small file's eval split holds 2 P rows only
    assert train.load_data(tiny_config(model_dir, data, tmp_path / "run", eval_every=0))[1] == []


@pytest.mark.integration
def test_nonfinite_loss_skips_the_step(tiny_run_inputs, tmp_path, monkeypatch):
    model_dir, data = tiny_run_inputs
    real_loss = grpo.loss
    calls = {"n": 0}

    def poisoned_first_call(*args, **kwargs):
        loss, stats = real_loss(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan"), stats) if calls["n"] == 1 else (loss, stats)

    monkeypatch.setattr(grpo, "loss", poisoned_first_call)
    cfg = tiny_config(model_dir, data, tmp_path / "run", steps=2, micro_batch_size=64)
    out = train.main(cfg, grpo.GRPOConfig(entropy_coef=0.01, beta=0.05, beta_schedule="adaptive"))
    rows = records(out)
    assert rows[0]["guard/nonfinite"] == 1.0 and rows[0]["guard/skipped_steps"] == 1
    assert rows[0]["update/applied"] == 0.0 and rows[1]["update/applied"] == 1.0
    assert rows[1]["guard/nonfinite"] == 0.0
    assert rows[1]["beta"] == rows[0]["beta"] == 0.05  # a skipped step does not move the adaptive beta
    assert all(torch.isfinite(t).all() for t in weights(out).values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, cfg: train.TrainConfig, gcfg: grpo.GRPOConfig) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank))
    torch.set_num_threads(1)
    train.main(cfg, gcfg)
    torch.distributed.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize("zero_std,chunk", [("keep", 2), ("keep", 4), ("resample", 2)],
                         ids=["split chunks", "one chunk: rank 1 idle", "resampling"])
def test_two_gloo_processes_make_the_single_process_update(tiny_run_inputs, tmp_path, zero_std, chunk):
    model_dir, data = tiny_run_inputs
    gcfg = grpo.GRPOConfig(beta=0.05, aggregation="dapo", entropy_coef=0.01)
    cfg = tiny_config(model_dir, data, tmp_path / "single", steps=2, checkpoint_every=2, zero_std=zero_std,
                      rollout_chunk=chunk, device="cpu")  # gloo, on any host
    single = weights(train.main(cfg, gcfg))
    ddp_cfg = replace(cfg, out=str(tmp_path / "ddp"))
    torch.multiprocessing.start_processes(_ddp_worker, args=(2, _free_port(), ddp_cfg, gcfg), nprocs=2,
                                          start_method="spawn")
    ddp = weights(tmp_path / "ddp")
    # Float rounding: each rank groups its own rows into micro-batches by length, and AdamW divides a near-zero
    # gradient by its own size, so such a weight's step carries the rounding (up to 9e-6 seen; lr is 1e-3).
    for k in single:
        torch.testing.assert_close(ddp[k], single[k], rtol=1e-5, atol=2e-5)
    # samples.jsonl holds the first groups of the step, whichever rank sampled them; the first step's are
    # sampled from the same weights (later ones from weights that may differ by the rounding above)
    single_rows, ddp_rows = ([json.loads(line) for line in (tmp_path / run / "samples.jsonl").read_text().splitlines()]
                             for run in ("single", "ddp"))
    assert [(r["step"], r["prompt"]) for r in ddp_rows] == [(r["step"], r["prompt"]) for r in single_rows]
    assert [r for r in ddp_rows if r["step"] == 1] == [r for r in single_rows if r["step"] == 1]
    # the logged step stats cover every rank's groups, not rank 0's alone
    for a, b in zip(records(tmp_path / "single"), records(tmp_path / "ddp")):
        for key in ("reward/mean", "reward/P", "reward/A", "completion/len_mean", "frac_zero_std", "ratio/max"):
            assert a.get(key) == pytest.approx(b.get(key)), key


def test_default_rollout_chunk_gives_every_rank_prompts():
    cfg, limits = train.TrainConfig(batch_size=16), {"P": 8, "A": 8}
    assert step.rollout_config(cfg, RewardConfig(), limits, runtime.Dist()).chunk == 16
    assert step.rollout_config(cfg, RewardConfig(), limits, runtime.Dist(rank=3, world=4)).chunk == 4
    assert step.rollout_config(replace(cfg, rollout_chunk=16), RewardConfig(), limits,
                               runtime.Dist(rank=3, world=4)).chunk == 16
    with pytest.raises(ValueError, match="rollout_chunk"):
        train.TrainConfig(rollout_chunk=0)


def test_bad_model_path_is_one_clear_line(tmp_path, capsys):
    code = cli.main(["train", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "run")])
    assert code == 2 and "missing" in one_error_line(capsys)


@pytest.mark.parametrize("flags, message", [
    (["--group-size", "1"], "group_size must be >= 2"),
    (["--temperature-p", "0"], "temperature_p, top_p_p: temperature must be finite and > 0"),
    (["--top-p-a", "1.5"], "temperature_a, top_p_a: top_p must be in (0, 1]"),
    (["--eval-temperature", "1e-9"], "eval_temperature: temperature must be finite and > 0"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
    (["--lr", "0"], "lr must be finite and > 0"),
    (["--max-new-tokens-a", "0"], "max_new_tokens_p and max_new_tokens_a must be >= 1"),
    (["--processes", "0"], "processes must be >= 1, got 0"),
    (["--log-samples", "-1"], "log_samples must be >= 0, got -1"),
    (["--max-rollbacks", "-1"], "max_rollbacks must be >= 0, got -1"),
    (["--eval-self-play", "-1"], "eval_self_play must be >= 0 (0: none), got -1"),
    (["--resample-rounds", "-1"], "resample_rounds must be >= 0, got -1"),
    (["--baseline", "greedy"], "baseline must be one of ('group', 'rloo', 'ema')"),
    (["--device", "foo"], "--device foo: not a torch device"),
])
def test_impossible_config_is_one_clear_line_before_any_work(tmp_path, capsys, flags, message):
    code = cli.main(["train", *flags, "--out", str(tmp_path / "run")])
    assert code == 2 and message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_completion_limit_beyond_the_context_is_one_clear_line(tiny_run_inputs, tmp_path, capsys):
    model_dir, data = tiny_run_inputs  # a context of 256 tokens; the fixtures' P prompts take about 70
    code = cli.main(["train", "--model", str(model_dir), "--data", str(data), "--max-new-tokens-p", "250",
                     "--threads", "1", "--processes", "1", "--out", str(tmp_path / "run")])
    assert code == 2 and "--max-new-tokens-p 250: the longest P prompt has" in one_error_line(capsys)


@pytest.mark.integration
def test_each_rollback_scales_the_learning_rate_by_lr_backoff(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    for backoff in (0.25, 1.0):
        run = tmp_path / f"backoff-{backoff}"
        cfg = tiny_config(model_dir, data, run, steps=6, kl_max=1e-12, max_rollbacks=2, lr=1e-2, lr_backoff=backoff)
        with pytest.raises(train.TrainingStopped, match="rollbacks"):
            train.main(cfg, grpo.GRPOConfig(beta=0.1, entropy_coef=0.01))
        taken = [r for r in records(run) if not r.get("guard/rollback")]  # the steps that were kept
        assert {r["guard/rollbacks"] for r in taken} == {0, 1, 2}
        for r in taken:  # each rollback so far has scaled the learning rate once
            assert r["lr"] == pytest.approx(1e-2 * backoff ** r["guard/rollbacks"])


@pytest.mark.integration
@pytest.mark.parametrize("view", ["squares", "named"])
def test_a_view_model_trains_on_fen_text_and_keeps_its_view(tiny_run_inputs, tmp_path, view):
    from rookworld.hub import load_model, save_model
    from rookworld.tokenizer import fen_text

    model_dir, data = tiny_run_inputs
    model, chars = load_model(model_dir)
    converted = tmp_path / view
    save_model(model, chars.with_view(view), converted)  # the same bytes, boards in the view
    run = tmp_path / "run"
    train.main(tiny_config(converted, data, run, steps=2, log_samples=8), grpo.GRPOConfig(beta=0.05, entropy_coef=0.01))
    assert load_model(run / "checkpoint-last")[1].view == view
    logged = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    # completions decoded to FEN for the rewards: nothing of the view is left to rewrite
    assert logged and all(fen_text(r["completion"], view) == r["completion"] for r in logged)


@pytest.mark.integration
def test_overfit_single_batch_samples_the_first_batchs_prompts_every_step(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    prompts = {}
    for overfit in (False, True):
        run = tmp_path / f"overfit-{overfit}"
        train.main(tiny_config(model_dir, data, run, steps=3, log_samples=4, overfit_single_batch=overfit),
                   grpo.GRPOConfig(beta=0.05, entropy_coef=0.01))
        logged = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        prompts[overfit] = [[r["prompt"] for r in logged if r["step"] == step] for step in (1, 2, 3)]
        assert all(len(step) == 4 for step in prompts[overfit])
    assert prompts[True] == [prompts[False][0]] * 3
    assert prompts[False][1] != prompts[False][0]


@pytest.mark.integration
def test_overfit_single_batch_resamples_no_zero_std_group(tiny_run_inputs, tmp_path):
    """Under --zero-std resample (the default) the one batch's zero-std groups are dropped, not replaced."""
    model_dir, data = tiny_run_inputs
    run = tmp_path / "run"
    train.main(tiny_config(model_dir, data, run, steps=3, log_samples=4, overfit_single_batch=True,
                           zero_std="resample"), grpo.GRPOConfig(beta=0.05, entropy_coef=0.01))
    logged = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    prompts = [[r["prompt"] for r in logged if r["step"] == step] for step in (1, 2, 3)]
    assert len(prompts[0]) == 4 and prompts == [prompts[0]] * 3
    assert all(r["frac_zero_std"] > 0 for r in records(run))  # groups that resampling would have replaced


@pytest.mark.integration
def test_eval_temperature_reaches_the_sampled_eval(tiny_run_inputs, tmp_path):
    from rookworld.hub import resolve_default_model

    found = {}
    for temperature in (1e-6, 3.0):  # the embedded model, whose completions are worth judging
        cfg = tiny_config(resolve_default_model(), tiny_run_inputs[1], tmp_path / f"t{temperature}", steps=1,
                          eval_every=1, eval_limit=8, eval_draws=2, eval_sampled_limit=8,
                          eval_temperature=temperature, max_new_tokens_p=None, max_new_tokens_a=None, lr=1e-12,
                          eval_self_play=0)
        run = train.main(cfg, grpo.GRPOConfig())
        found[temperature] = json.loads((run / "eval.jsonl").read_text().splitlines()[0])
    cold, hot = found[1e-6], found[3.0]
    assert not any(key.startswith("eval/selfplay/") for key in cold)  # --eval-self-play 0: no games
    assert cold["eval/reward/mean"] == hot["eval/reward/mean"]  # the greedy eval of the same model
    # almost no temperature: both draws are the greedy completion; three times as hot: worse ones
    assert cold["eval/sampled/reward/mean"] == pytest.approx(cold["eval/reward/mean"])
    assert hot["eval/sampled/reward/mean"] < cold["eval/reward/mean"] - 0.1


@pytest.mark.integration
def test_ref_device_holds_the_reference_and_full_kl_needs_it_beside_the_policy(tiny_run_inputs, tmp_path, capsys):
    model_dir, data = tiny_run_inputs
    gcfg = grpo.GRPOConfig(beta=0.05, entropy_coef=0.01)
    default = train.main(tiny_config(model_dir, data, tmp_path / "default"), gcfg)
    on_cpu = train.main(tiny_config(model_dir, data, tmp_path / "cpu", device="cpu", ref_device="cpu"), gcfg)
    a, b = weights(default), weights(on_cpu)
    assert all(torch.equal(a[k], b[k]) for k in a)
    code = cli.main(["train", "--model", str(model_dir), "--data", str(data), "--device", "cpu", "--ref-device",
                     "cuda", "--kl-estimator", "full", "--out", str(tmp_path / "full")])
    assert code == 2 and "needs the reference on the policy's device" in capsys.readouterr().err


@pytest.mark.integration
def test_kl_runaway_rolls_back_then_stops_with_a_valid_checkpoint(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "run", steps=6, checkpoint_every=1, kl_max=1e-12, max_rollbacks=1,
                      lr=1e-2, keep_last=5)
    with pytest.raises(train.TrainingStopped, match="rollbacks"):
        train.main(cfg, grpo.GRPOConfig(beta=0.1, entropy_coef=0.01))
    run = tmp_path / "run"
    rows = records(run)
    # step 1 (policy == reference: KL 0) is good and checkpointed; steps 2 and 3 exceed kl_max and roll back,
    # the second rollback stops the run with the restored state saved as step 3, logged first like every step
    assert [r["guard/rollbacks"] for r in rows] == [0, 1, 2] and rows[2]["guard/rollback"] == 1.0
    assert {json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()} == {1, 2, 3}
    assert checkpoint.read_info(run / checkpoint.LAST)["step"] == 3
    good = run / checkpoint.step_dir_name(1)
    for rolled_back in (run / checkpoint.step_dir_name(2), run / checkpoint.LAST):
        a, b = load_file(str(good / "model.safetensors")), load_file(str(rolled_back / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a)  # the weights are the snapshot's
        opt_a, opt_b = (checkpoint.load_state(d)["optimizer"]["state"] for d in (good, rolled_back))
        assert opt_a.keys() == opt_b.keys() and opt_a
        assert all(torch.equal(opt_a[i][k], opt_b[i][k]) for i in opt_a for k in opt_a[i])  # and AdamW's moments


@pytest.mark.integration
def test_checkpoint_best_holds_the_weights_its_metrics_describe(tiny_run_inputs, tmp_path):
    from rookworld.data.sources import load_source
    from rookworld.evaluate import EvalConfig, evaluate_model
    from rookworld.hub import load_model
    from rookworld.stockfish import StockfishPool

    model_dir, data = tiny_run_inputs
    cfg = tiny_config(model_dir, data, tmp_path / "run", steps=6, eval_every=3, checkpoint_every=2, eval_limit=8,
                      eval_draws=0, lr=3e-3, keep_last=6)
    out = train.main(cfg, grpo.GRPOConfig(beta=0.05, entropy_coef=0.01))
    best = checkpoint.best(out)
    info = checkpoint.read_info(best)
    assert info["step"] in (3, 6)  # an evaluated step, never a checkpoint that carried older eval metrics
    for unevaluated in (2, 4):
        assert "eval/reward/mean" not in checkpoint.read_info(out / checkpoint.step_dir_name(unevaluated))["metrics"]
    with StockfishPool(processes=1) as pool:
        for evaluated in (best, out / checkpoint.LAST):
            model, tokenizer = load_model(evaluated)
            again = evaluate_model(model, tokenizer, load_source(str(data), "eval", limit=8).samples,
                                   EvalConfig(batch_size=64), pool)
            recorded = checkpoint.read_info(evaluated)["metrics"]["eval/reward/mean"]
            assert again["reward/mean"] == pytest.approx(recorded, abs=1e-9)


@pytest.mark.integration
def test_each_eval_logs_its_paired_change_since_step_0_also_after_a_resume(tiny_run_inputs, tmp_path):
    from rookworld.data.sources import load_source
    from rookworld.evaluate import EvalConfig, evaluate_model
    from rookworld.hub import load_model, resolve_default_model
    from rookworld.log import read_records
    from rookworld.stockfish import StockfishPool

    model_dir, data = resolve_default_model(), tiny_run_inputs[1]  # a model whose answers a step can change
    options = dict(eval_every=2, checkpoint_every=2, eval_limit=8, eval_draws=0, eval_self_play=0, lr=1e-2,
                   max_new_tokens_p=None, max_new_tokens_a=None)
    out = train.main(tiny_config(model_dir, data, tmp_path / "run", steps=2, **options), grpo.GRPOConfig())
    samples = load_source(str(data), "eval", limit=8).samples
    with StockfishPool(processes=1) as pool:
        start, last = (evaluate_model(*load_model(m), samples, EvalConfig(batch_size=64), pool)
                       for m in (model_dir, out / checkpoint.LAST))
    evals = read_records(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and not any(k.endswith("/delta") for k in evals[0])
    change = evals[-1]["eval/reward/mean/delta"]  # the same prompts' change from the start model's own eval
    assert change == pytest.approx(last["reward/mean"] - start["reward/mean"], abs=1e-9) and change != 0
    assert evals[-1]["eval/reward/mean/delta/se"] > 0
    straight = train.main(tiny_config(model_dir, data, tmp_path / "straight", steps=4, **options), grpo.GRPOConfig())
    train.main(tiny_config(model_dir, data, tmp_path / "run", steps=4, **options), grpo.GRPOConfig(), resume=str(out))
    resumed = read_records(out / "eval.jsonl")  # the checkpoint carries the step-0 values to pair with
    assert [e["step"] for e in resumed] == [0, 2, 4]
    assert resumed == read_records(straight / "eval.jsonl") and "eval/reward/mean/delta" in resumed[-1]
    # an evaluation changed on resume (fewer prompts) has nothing to pair with: no change is logged
    train.main(tiny_config(model_dir, data, tmp_path / "run", steps=6, **{**options, "eval_limit": 1}),
               grpo.GRPOConfig(), resume=str(out))
    changed = read_records(out / "eval.jsonl")
    assert [e["step"] for e in changed] == [0, 2, 4, 6]
    assert changed[-1]["eval/reward/mean/n"] < changed[-2]["eval/reward/mean/n"]
    assert not any(k.endswith("/delta") for k in changed[-1])


def test_eval_world_games_plays_games_in_the_models_world_at_each_eval(tiny_run_inputs, tmp_path):
    from rookworld.log import read_records

    model_dir, data = tiny_run_inputs
    options = dict(steps=1, eval_every=1, eval_limit=2, eval_draws=0, eval_self_play=0)
    plain = read_records(train.main(tiny_config(model_dir, data, tmp_path / "plain", **options),
                                    grpo.GRPOConfig()) / "eval.jsonl")
    world = read_records(train.main(tiny_config(model_dir, data, tmp_path / "world", eval_world_games=2, **options),
                                    grpo.GRPOConfig()) / "eval.jsonl")
    assert not any(key.startswith("eval/world/") for row in plain for key in row)
    for row in world:  # step 0 and step 1
        assert row["eval/world/plies_to_divergence/n"] == 2 and row["eval/world/censored/n"] == 2


def test_inspect_reports_one_step_in_full(tiny_run_inputs, tmp_path, capsys):
    model_dir, data = tiny_run_inputs
    report_file = tmp_path / "step.json"
    code = cli.main(["inspect", "--model", str(model_dir), "--data", str(data), "--batch-size", "3",
                     "--group-size", "4", "--max-new-tokens-p", "16", "--max-new-tokens-a", "16", "--processes", "1",
                     "--beta", "0.05", "--entropy-coef", "0.01", "--zero-std", "keep", "--json", str(report_file)])
    assert code == 0
    report = json.loads(report_file.read_text())
    assert len(report["prompts"]) == 3
    rewards = [c["reward"] for p in report["prompts"] for c in p["completions"]]
    assert len(rewards) == 12 and all(-1.0 <= r <= 1.0 for r in rewards)
    assert report["reward_before"] == pytest.approx(sum(rewards) / 12)
    for p in report["prompts"]:
        advantages = [c["advantage"] for c in p["completions"]]
        assert sum(advantages) == pytest.approx(0.0, abs=1e-5)  # the group mean is the baseline
        assert p["zero_std"] == (len({c["reward"] for c in p["completions"]}) == 1)
        for c in p["completions"]:
            assert {"completion", "components", "pg_loss", "kl/mean", "entropy"} <= c.keys()
            assert c["kl/mean"] == pytest.approx(0.0, abs=1e-6)  # before the update, policy == reference
    update = report["update"]
    assert math.isfinite(update["grad_norm"]) and update["grad_norm"] > 0
    assert "mean reward on this batch" in capsys.readouterr().out


@pytest.mark.integration
def test_inspect_takes_the_trainers_limits_and_zero_std(tiny_run_inputs, tmp_path):
    model_dir, data = tiny_run_inputs
    report_file = tmp_path / "step.json"
    code = cli.main(["inspect", "--model", str(model_dir), "--data", str(data), "--batch-size", "4",
                     "--group-size", "3", "--max-new-tokens-p", "5", "--max-new-tokens-a", "7", "--processes", "1",
                     "--temperature-p", "0.3", "--temperature-a", "0.3", "--zero-std", "drop", "--json",
                     str(report_file), "--baseline", "rloo"])
    assert code == 0
    prompts = json.loads(report_file.read_text())["prompts"]
    for p in prompts:  # a character-level tokenizer: one character per token
        limit = 5 if p["task"] == "P" else 7
        assert all(len(c["completion"]) <= limit for c in p["completions"])
        assert p["in_loss"] == (not p["zero_std"])  # --zero-std drop keeps zero-std groups out of the loss
        rewards = torch.tensor([c["reward"] for c in p["completions"]])
        loo = (rewards - rewards.mean()) * 3 / 2  # --baseline rloo: against the mean of the other two
        expected = 0 * rewards if p["zero_std"] else loo / rewards.std()
        assert torch.allclose(torch.tensor([c["advantage"] for c in p["completions"]]), expected, atol=1e-5)
    assert any(p["zero_std"] for p in prompts)

