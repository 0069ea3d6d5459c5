"""`rookworld train [--steps N] [--out DIR] [--resume DIR] [--config FILE.toml] ...`: the GRPO loop.

Each step draws B prompts (P/A mix) and takes one GRPO step on them (step.py); around it the loop keeps the
guards (skipped and rolled-back steps), logging, periodic evaluation, atomic checkpoints and exact resume.

Randomness is explicit: completions come from generators seeded by (seed, step, chunk) (rollout.py),
so a step is reproducible from the run state alone (exact resume) and from any number of ranks.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rookworld import checkpoint, grpo, training
from rookworld.data.record import Sample
from rookworld.errors import UserError
from rookworld.evaluate import EvalConfig, Values, model_values, paired_change
from rookworld.generation import FastDecoder
from rookworld.rewards import RewardConfig
from rookworld.rollout import Group, completion_limits
from rookworld.runtime import Dist, fast_path, gather_indexed, init_distributed
from rookworld.step import rollout_config, take_step
from rookworld.train_config import TrainConfig

# ---------------------------------------------------------------- setup


def make_baseline(gcfg: grpo.GRPOConfig) -> grpo.EMABaseline | None:
    return grpo.EMABaseline(gcfg.ema_momentum) if gcfg.baseline == "ema" else None


def set_lr(optimizer: torch.optim.Optimizer, cfg: TrainConfig, state: RunState) -> None:
    """The learning rate of the step about to be taken: schedule times the rollback back-off."""
    training.set_lr(optimizer, cfg.lr * state.lr_scale * training.lr_factor(cfg, state.step))


def load_reference(cfg: TrainConfig, gcfg: grpo.GRPOConfig, device: str):
    """The frozen starting model the KL terms measure against, on --ref-device (None with beta 0)."""
    from rookworld.hub import load_model, resolve_default_model

    if gcfg.beta <= 0:
        return None
    ref_device = cfg.ref_device or device
    if gcfg.kl_estimator == "full" and ref_device != device:
        raise UserError("--kl-estimator full needs the reference on the policy's device; drop --ref-device")
    reference, _ = load_model(cfg.model or str(resolve_default_model()), device=ref_device)
    return reference.requires_grad_(False)


def batch_sampler(cfg: TrainConfig, train_samples: list[Sample]):
    """The sampler of the GRPO prompts."""
    from rookworld.data.batches import TaskSampler

    return TaskSampler(train_samples, p_fraction=cfg.p_fraction, seed=cfg.seed)


# ---------------------------------------------------------------- state


@dataclass
class RunState:
    """What a checkpoint holds besides the model (exact resume)."""

    step: int = 0
    lr_scale: float = 1.0
    rollbacks: int = 0
    skipped_steps: int = 0
    reward_history: list[float] = field(default_factory=list)


def snapshot(policy, optimizer, beta_ctl: grpo.BetaController, parts: dict[str, Any]) -> dict[str, Any]:
    """In-memory copy of the last good state, restored by a rollback; `parts`: the run's optional stateful
    pieces by name (the ema baseline), None where off."""
    return {"policy": copy.deepcopy(policy.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict()),
            "beta": beta_ctl.state_dict(),
            **{name: None if part is None else copy.deepcopy(part.state_dict()) for name, part in parts.items()}}


def restore(snap: dict[str, Any], policy, optimizer, beta_ctl: grpo.BetaController, parts: dict[str, Any]) -> None:
    policy.load_state_dict(snap["policy"])
    optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
    beta_ctl.load_state_dict(snap["beta"])
    for name, part in parts.items():
        if part is not None:
            part.load_state_dict(copy.deepcopy(snap[name]))  # a snapshot may be restored more than once


def check_resumable(saved: dict[str, Any], resume_dir: Path, gcfg: grpo.GRPOConfig) -> None:
    """Refuse, before any work, a checkpoint that this config cannot continue as one uninterrupted run of it
    would go: one saved without the ema baseline this config needs."""
    if gcfg.baseline == "ema" and saved.get("baseline") is None:
        raise UserError(f"{resume_dir} holds no ema baseline state: it was saved by a run without --baseline ema; "
                        "resume with that run's own config.json")


def load_run(saved: dict[str, Any], policy, optimizer, cfg: TrainConfig, parts: dict[str, Any]) -> RunState:
    """A checkpoint's saved state (checked by check_resumable) put into a run's pieces: `parts` by their names in
    the checkpoint (None: this config has none) and the optimizer's moments with this config's AdamW settings;
    returns the run's counters."""
    for name, part in parts.items():
        if part is not None:
            part.load_state_dict(saved[name])
    training.load_optimizer(optimizer, saved["optimizer"], cfg)
    return RunState(**saved["run"])


def inactive_kl_guard(cfg: TrainConfig, gcfg: grpo.GRPOConfig) -> str | None:
    """The note that --kl-max guards nothing for a while, or at all: the KL is measured only while beta > 0 (at
    beta 0 the reference pass is skipped, or the reference is not even loaded)."""
    if not cfg.kl_max:
        return None
    if gcfg.beta <= 0:
        return f"--kl-max {cfg.kl_max} is inactive: with --beta 0 no KL is measured"
    if gcfg.beta_schedule == "warmup" and gcfg.beta_warmup_steps:
        return (f"--kl-max {cfg.kl_max} is inactive for the first {gcfg.beta_warmup_steps} steps: beta is 0 "
                f"during --beta-schedule warmup's --beta-warmup-steps, and no KL is measured while it is")
    return None


def runaway_reason(cfg: TrainConfig, metrics: dict[str, float], state: RunState) -> str | None:
    kl = metrics.get("kl/mean")
    if cfg.kl_max and kl is not None and kl > cfg.kl_max:
        return f"KL {kl:.4f} above kl_max {cfg.kl_max}"
    history = state.reward_history
    if cfg.reward_drop and len(history) >= 10:
        recent = sum(history[-5:]) / 5
        best = max(sum(history[i - 5:i]) / 5 for i in range(5, len(history) + 1))
        if recent < best - cfg.reward_drop:
            return f"reward collapse: 5-step mean {recent:.3f} vs best {best:.3f}"
    return None


def count_rollback(cfg: TrainConfig, state: RunState) -> bool:
    """A rollback's counters: one more rollback, the learning rate backed off, the reward history cleared;
    whether the run must stop (more than max_rollbacks)."""
    state.rollbacks += 1
    state.lr_scale *= cfg.lr_backoff
    state.reward_history.clear()
    return state.rollbacks > cfg.max_rollbacks


class TrainingStopped(UserError):
    """The run cannot continue (e.g. too many rollbacks); the last good checkpoint is on disk."""


# ---------------------------------------------------------------- main


def sample_rows(groups: list[Group | None], count: int, d: Dist) -> list[dict[str, Any]]:
    """samples.jsonl's rows of a step: the first completion of each of the first `count` groups, gathered from
    the ranks that hold them, so that a torchrun run logs what one process would."""
    rows = gather_indexed({i: {"prompt": g.sample.prompt, "completion": g.completions[0], "reward": g.rewards[0]}
                           for i, g in enumerate(groups[:count]) if g is not None}, d)
    return [rows[i] for i in sorted(rows)]


def load_data(cfg: TrainConfig):
    from rookworld.data.batches import balanced_subset
    from rookworld.data.sources import load_source

    train = load_source(cfg.data, "train").samples
    evals = balanced_subset(load_source(cfg.data, "eval").samples, cfg.eval_limit) if cfg.eval_every else []
    return train, evals


def eval_plan(cfg: TrainConfig, eval_samples: list[Sample]) -> dict[str, tuple[EvalConfig, list[Sample]]]:
    """Each periodic evaluation's metric prefix, settings and samples: greedy, then (with eval_draws) sampled at a
    fixed seed, so that every eval of every run draws the same random stream."""
    from rookworld.data.batches import balanced_subset

    evals = {"eval/": (EvalConfig(batch_size=64, self_play=cfg.eval_self_play, world_games=cfg.eval_world_games,
                                  draft_a=cfg.draft_a), eval_samples)}
    if cfg.eval_draws:
        sampled = EvalConfig(batch_size=64, samples=cfg.eval_draws, temperature=cfg.eval_temperature,
                             draft_a=cfg.draft_a)
        evals["eval/sampled/"] = (sampled, balanced_subset(eval_samples, cfg.eval_sampled_limit))
    return evals


def eval_key(eval_cfg: EvalConfig, samples: list[Sample]) -> str:
    """A digest of what decides an evaluation's values besides the model: its settings and its samples."""
    blob = json.dumps([asdict(eval_cfg), [s.to_json() for s in samples]], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def saved_first_values(first_values: dict[str, Values], keys: dict[str, str]) -> dict[str, Any]:
    """The step-0 values as a checkpoint carries them, each with the key of the evaluation it came from."""
    return {prefix: {"key": keys[prefix], "per_prompt": [dict(row) for row in values.per_prompt],
                     "per_game": [dict(row) for row in values.per_game]}
            for prefix, values in first_values.items()}


def resumed_first_values(saved: dict[str, Any], keys: dict[str, str]) -> dict[str, Values]:
    """The step-0 values a checkpoint carries for the evaluations this run repeats unchanged (the same settings
    and samples); an evaluation changed on resume, or a checkpoint without them, has none to pair with."""
    return {prefix: Values(entry["per_prompt"], entry["per_game"])
            for prefix, entry in saved.get("first_eval", {}).items() if keys.get(prefix) == entry["key"]}


def main(cfg: TrainConfig, gcfg: grpo.GRPOConfig, resume: str | None = None,
         rcfg: RewardConfig | None = None) -> Path:
    """Run GRPO with the reward `rcfg` (default: RewardConfig()); returns the run directory. Held-out
    evaluation scores with the default reward, so runs with different rewards compare on one scale."""
    from rookworld.hub import load_model, resolve_default_model, save_model
    from rookworld.log import EVAL_FILE, Progress, RunLogger, eval_change, eval_line, read_records
    from rookworld.runtime import pick_device
    from rookworld.stockfish import StockfishPool

    d, device = init_distributed(pick_device(cfg.device, cfg.threads))
    torch.manual_seed(cfg.seed)
    rcfg = rcfg or RewardConfig()
    out, resume_dir, saved = Path(cfg.out), None, None
    if resume is None:
        training.check_new_out(out)
    else:
        out = Path(resume)
        resume_dir = training.resume_checkpoint(resume, cfg)
        saved = checkpoint.load_state(resume_dir)
        check_resumable(saved, resume_dir, gcfg)
    note = inactive_kl_guard(cfg, gcfg)
    if note and d.main:
        print(note, file=sys.stderr)
    model_source = str(resume_dir or cfg.model or resolve_default_model())
    policy, tokenizer = load_model(model_source, device=device)
    policy.train()
    decoder = FastDecoder(policy) if fast_path(cfg.fast_decode, device) else None
    reference = load_reference(cfg, gcfg, device)

    train_samples, eval_samples = load_data(cfg)
    limits = completion_limits({"P": cfg.max_new_tokens_p, "A": cfg.max_new_tokens_a}, tokenizer, train_samples,
                               policy.config.n_positions)
    rollout_cfg = rollout_config(cfg, rcfg, limits, d)
    sampler = batch_sampler(cfg, train_samples)
    optimizer = training.make_optimizer(policy, cfg)
    beta_ctl = grpo.BetaController(gcfg)
    ema = make_baseline(gcfg)
    parts = {"baseline": ema}
    state = RunState()
    if saved is not None:
        if d.main:
            checkpoint.clear_debris(out)
        state = load_run(saved, policy, optimizer, cfg, {"sampler": sampler, "beta": beta_ctl, "baseline": ema})
    set_lr(optimizer, cfg, state)
    good = snapshot(policy, optimizer, beta_ctl, parts)
    fixed_batch = sampler.next(cfg.batch_size) if cfg.overfit_single_batch else None
    evals = eval_plan(cfg, eval_samples)
    eval_keys = {prefix: eval_key(eval_cfg, samples) for prefix, (eval_cfg, samples) in evals.items()}
    # each eval set's values at step 0, which later evals pair with; checkpoints carry them to a resumed run
    first_values = resumed_first_values(saved, eval_keys) if saved is not None else {}

    def held_out(step: int, pool) -> dict[str, float]:
        if decoder is not None:
            decoder.sync(policy)
        found = {}
        for prefix, (eval_cfg, samples) in evals.items():
            result, values = model_values(policy, tokenizer, samples, eval_cfg, pool, decoder)
            if step == 0:
                first_values[prefix] = values
            elif prefix in first_values:  # the paired change since step 0
                result |= paired_change(values, first_values[prefix], samples)
            found |= {f"{prefix}{k}": v for k, v in result.items()}
        logger.log_eval(step, found)
        progress.note(eval_line(step, found))
        return found

    run_config = {"train": asdict(cfg), "grpo": asdict(gcfg), "reward": asdict(rcfg)}

    def write_model(directory: Path) -> None:
        save_model(policy, tokenizer, directory,
                   metadata={"trained_with": "rookworld train", **run_config})

    def save_checkpoint(metrics: dict[str, float] | None = None) -> None:
        if d.main:
            checkpoint.save(out, state.step, {"optimizer": optimizer.state_dict(), "sampler": sampler.state_dict(),
                                              "beta": beta_ctl.state_dict(), "run": asdict(state),
                                              "baseline": None if ema is None else ema.state_dict(),
                                              "first_eval": saved_first_values(first_values, eval_keys)},
                            write_model, metrics=metrics, keep_last=cfg.keep_last, best_metric="eval/reward/mean")

    logger = RunLogger(out, run_config, tensorboard=cfg.tensorboard,
                       wandb_project=cfg.wandb_project, rank=d.rank,
                       resume_step=state.step if resume_dir is not None else None, start_over=resume_dir is None)
    progress = Progress(cfg.steps, start=state.step, rank=d.rank)
    with StockfishPool(processes=cfg.processes) as pool, logger, progress:
        if state.step == 0 and eval_samples:
            held_out(0, pool)
        while state.step < cfg.steps:
            t0 = time.perf_counter()
            samples = fixed_batch or sampler.next(cfg.batch_size)
            beta = beta_ctl.beta
            groups, metrics = take_step(policy, reference, optimizer, tokenizer, sampler, samples, cfg, gcfg,
                                        rollout_cfg, state.step, beta, ema, pool, d, decoder)
            if metrics["guard/nonfinite"]:
                state.skipped_steps += 1
            state.reward_history.append(metrics["reward/mean"])
            reason = runaway_reason(cfg, metrics, state)
            stop = None
            if reason is not None:
                restore(good, policy, optimizer, beta_ctl, parts)
                metrics["guard/rollback"] = 1.0
                print(f"step {state.step + 1}: {reason}; rolled back to the last good state, lr x"
                      f"{state.lr_scale * cfg.lr_backoff:g}")
                if count_rollback(cfg, state):
                    stop = TrainingStopped(f"{state.rollbacks} rollbacks ({reason}); the last good state is "
                                           f"saved in {out}/checkpoint-last. Lower --lr or raise --beta")
            elif metrics["update/applied"]:  # a step that changed nothing says nothing about the KL
                beta_ctl.update(metrics.get("kl/mean", 0.0))
            metrics["lr"] = optimizer.param_groups[0]["lr"]
            state.step += 1
            set_lr(optimizer, cfg, state)
            metrics.update({"beta": beta, "guard/skipped_steps": state.skipped_steps,
                            "guard/rollbacks": state.rollbacks, "time/step": time.perf_counter() - t0})
            logger.log(state.step, metrics)
            logger.log_samples(state.step, sample_rows(groups, cfg.log_samples, d))
            if stop is not None:  # saved after its logs, as every step: a resumed run's logs go on without a gap
                save_checkpoint()
                raise stop
            evaluation = held_out(state.step, pool) if eval_samples and training.eval_due(cfg, state.step) else {}
            # An evaluated step is checkpointed too, so checkpoint-best always holds the weights its
            # eval metrics describe; other checkpoints carry no eval metrics.
            if evaluation or training.checkpoint_due(cfg, state.step):
                save_checkpoint({**metrics, **evaluation})
                good = snapshot(policy, optimizer, beta_ctl, parts)
            progress.update(state.step, metrics)
        if eval_samples and d.main:
            change = eval_change(read_records(out / EVAL_FILE))
            if change:
                progress.note(change)
    return out


# ---------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rookworld.config import add_config_arguments
    from rookworld.flag_groups import ADVANCED, TRAIN

    training.add_run_arguments(parser, tables=", a [grpo] table the GRPO loss and KL fields, a [reward] table "
                               "the reward's")
    add_config_arguments(parser, TrainConfig, TRAIN, ADVANCED)
    add_config_arguments(parser, grpo.GRPOConfig, TRAIN, ADVANCED)
    add_config_arguments(parser, RewardConfig, TRAIN, ADVANCED)


def configs_from_args(args: argparse.Namespace) -> tuple[TrainConfig, grpo.GRPOConfig, RewardConfig]:
    configs = training.run_configs(args, {"train": TrainConfig, "grpo": grpo.GRPOConfig, "reward": RewardConfig})
    return configs["train"], configs["grpo"], configs["reward"]


def run(args: argparse.Namespace) -> int:
    cfg, gcfg, rcfg = configs_from_args(args)
    out = main(cfg, gcfg, resume=args.resume, rcfg=rcfg)
    print(f"run directory: {out}")
    return 0

