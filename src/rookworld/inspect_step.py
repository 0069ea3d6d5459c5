"""`rookworld inspect [--model M] [--batch-size B] [--group-size G] [--json FILE] ...`: one GRPO step told in full.

For each prompt: its completions, rewards and reward components, advantages, and each completion's
policy-gradient, KL and entropy terms; for the step: the loss parts, KL share and gradient norm; and
the mean reward of the same prompts sampled with the same random streams before and after the update.
Takes the same flags as `rookworld train` (whose functions it calls): a run's first step, or with --resume DIR
the run's next step from its latest checkpoint (weights, optimizer, sampler position, beta and the rest of
its saved state); nothing is written but --json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rookworld import checkpoint, grpo, training
from rookworld.fsutil import output_file
from rookworld.rewards import RewardConfig
from rookworld.rollout import Batch, collect, completion_limits, rollout
from rookworld.runtime import Dist
from rookworld.step import learning_groups, policy_update, rollout_config, step_advantages
from rookworld.train import (
    RunState,
    TrainConfig,
    batch_sampler,
    check_resumable,
    configs_from_args,
    load_data,
    load_reference,
    load_run,
    make_baseline,
    set_lr,
)


def per_sequence_terms(policy, reference, batch: Batch, gcfg: grpo.GRPOConfig, beta: float) -> list[dict]:
    """pg_loss, kl/mean and entropy of each sequence on its own (grpo aggregation over its tokens)."""
    from rookworld.model import token_logprobs

    single = grpo.GRPOConfig(**{**gcfg.__dict__, "aggregation": "grpo", "mask_truncated": False})
    rows = []
    with torch.no_grad():
        for mb in batch.micro_batches(1):
            full = gcfg.kl_estimator == "full" and reference is not None and beta > 0
            tl = token_logprobs(policy, mb.completions, mb.completion_mask, prompts=mb.prompts, entropy=True,
                                temperature=mb.temperature,
                                reference=reference if reference is not None and beta > 0 else None, kl=full,
                                kl_direction=gcfg.kl_direction)
            _, stats = grpo.loss(tl.logp, tl.logp, tl.ref_logp if not full else None, mb.advantages,
                                 mb.completion_mask, single, beta=beta, kl_per_token=tl.kl if full else None,
                                 entropy=tl.entropy)
            rows.append({k: stats[k] for k in ("pg_loss", "kl/mean", "entropy") if k in stats})
    return rows


def inspect_step(cfg: TrainConfig, gcfg: grpo.GRPOConfig, rcfg: RewardConfig | None = None,
                 resume: str | None = None) -> dict:
    """One step told in full: a run's first, or the next step of the run in the directory `resume`."""
    from rookworld.hub import load_model, resolve_default_model
    from rookworld.runtime import pick_device
    from rookworld.stockfish import StockfishPool

    device = pick_device(cfg.device, cfg.threads)
    torch.manual_seed(cfg.seed)
    resume_dir = training.resume_checkpoint(resume, cfg) if resume else None
    policy, tokenizer = load_model(str(resume_dir or cfg.model or resolve_default_model()), device=device)
    reference = load_reference(cfg, gcfg, device)
    train_samples, _ = load_data(TrainConfig(**{**cfg.__dict__, "eval_every": 0}))
    limits = completion_limits({"P": cfg.max_new_tokens_p, "A": cfg.max_new_tokens_a}, tokenizer, train_samples,
                               policy.config.n_positions)
    d = Dist()
    rollout_cfg = rollout_config(cfg, rcfg or RewardConfig(), limits, d)
    sampler = batch_sampler(cfg, train_samples)
    optimizer = training.make_optimizer(policy, cfg)
    beta_ctl, ema = grpo.BetaController(gcfg), make_baseline(gcfg)
    state = RunState()
    if resume_dir is not None:
        saved = checkpoint.load_state(resume_dir)
        check_resumable(saved, resume_dir, gcfg)
        state = load_run(saved, policy, optimizer, cfg, {"sampler": sampler, "beta": beta_ctl, "baseline": ema})
    set_lr(optimizer, cfg, state)
    step = state.step  # 0-based: it seeds the step's random streams and the reward's warm-up
    samples = sampler.next(cfg.batch_size)
    beta = beta_ctl.beta
    with StockfishPool(processes=cfg.processes) as pool:
        policy.eval()
        groups, summaries = collect(policy, tokenizer, sampler, samples, rollout_cfg, step, pool, d, {})
        adv = step_advantages(summaries, gcfg, ema)
        learn = learning_groups(groups, adv, cfg)
        advantages = [adv.values[i].to(device) for i in range(len(groups))]
        every = Batch.of(groups, advantages)
        terms = per_sequence_terms(policy, reference, every, gcfg, beta)
        # the step's prompts after resampling, sampled on the same random streams before and after the update
        final = [g.sample for g in groups]
        before = groups if final == samples else rollout(policy, tokenizer, final, rollout_cfg, step, 0, pool, d, {})
        policy.train()
        batch = Batch.of([groups[i] for i in learn], [advantages[i] for i in learn]) if learn else None
        update = policy_update(policy, reference, optimizer, batch, gcfg, cfg, beta, max(limits.values()), d)
        policy.eval()
        after = rollout(policy, tokenizer, final, rollout_cfg, step, 0, pool, d, {})
    G = cfg.group_size
    prompts = []
    for b, group in enumerate(groups):
        prompts.append({"task": group.sample.task, "prompt": group.sample.prompt, "target": group.sample.target,
                        "zero_std": bool(adv.zero_std[b]), "in_loss": b in learn,
                        "completions": [{"completion": c, "reward": r, "components": comp,
                                         "advantage": float(adv.values[b, j]), **terms[b * G + j]}
                                        for j, (c, r, comp) in enumerate(zip(group.completions, group.rewards,
                                                                             group.components))]})
    mean = lambda gs: sum(r for g in gs for r in g.rewards) / sum(len(g.rewards) for g in gs)  # noqa: E731
    return {"step": step + 1, "prompts": prompts, "update": update, "beta": beta, "frac_zero_std": adv.frac_zero_std,
            "reward_before": mean(before), "reward_after": mean(after)}


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for i, p in enumerate(report["prompts"]):
        table = Table("completion", "reward", "adv", "pg", "kl", "entropy", "components",
                      title=f"[{i}] {p['task']}  {p['prompt']}" + ("  (zero std)" if p["zero_std"] else "")
                      + ("" if p["in_loss"] else "  (not in the loss)"),
                      title_justify="left")
        for c in p["completions"]:
            table.add_row(repr(c["completion"][:70]), f"{c['reward']:.3f}", f"{c['advantage']:+.3f}",
                          f"{c['pg_loss']:+.4f}", f"{c.get('kl/mean', 0.0):.4f}", f"{c['entropy']:.3f}",
                          " ".join(f"{k}={v:.2f}" for k, v in c["components"].items()))
        console.print(table)
    u = report["update"]
    console.print(f"loss {u.get('loss', 0):+.5f} = pg {u.get('pg_loss', 0):+.5f} + kl {u.get('kl_loss', 0):+.5f} "
                  f"+ entropy {u.get('entropy_loss', 0):+.5f} | kl_share {u.get('kl_share', 0):.3f} | grad_norm "
                  f"{u['grad_norm']:.4f} | beta {report['beta']:g} | frac_zero_std {report['frac_zero_std']:.2f}")
    console.print(f"step {report['step']}: mean reward on this batch (same random streams): before "
                  f"{report['reward_before']:.4f} -> after {report['reward_after']:.4f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rookworld.train import add_arguments as train_arguments

    train_arguments(parser)
    parser.add_argument("--json", dest="json_out", help="also write the report as JSON to this file")


def run(args: argparse.Namespace) -> int:
    configs = configs_from_args(args)
    json_out = output_file(Path(args.json_out), "--json") if args.json_out else None  # before the step's work
    report = inspect_step(*configs, resume=args.resume)
    print_report(report)
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0
