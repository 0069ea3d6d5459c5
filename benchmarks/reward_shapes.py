"""`python benchmarks/reward_shapes.py [--prompts 150] [--k 8] [--seed 0] [--cache PATH] [--config SPEC ...]`

How well each shape of the P reward's best_move credit ranks real moves. Samples k completions at
temperature 1.0 from the embedded model for N P prompts of the embedded eval split, scores them with
each RewardConfig (the engine for moves outside the stored analysis, as in training), and compares
with the eval's truth: `quality.judge_moves` at the label limit (expected-score loss of the B: move;
an illegal or missing move forfeits). Per shape, for the best_move component and the total P reward:
mean and std; the share of groups whose k rewards are all equal (no GRPO signal); the mean within-group
Spearman correlation with minus the true loss over the legal moves, and over all completions (a group
whose truth varies but whose rewards do not counts as 0); and the within-group sum of squares split
into the illegal-vs-legal difference, the differences among legal moves and those among illegal ones.

Columns: `default` (RewardConfig()), then each `--config`, a comma-separated list of RewardConfig
fields, e.g. `best_move_shape=linear,best_move_scale=0.5`; the last column treats minus the true loss
itself as the reward (legality's share of its variance is what a reward's should be near). One CPU
thread and one Stockfish process; `--cache` keeps the engine's results for reruns.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import numpy as np
import torch

from rookworld import quality, text
from rookworld.data.sources import load_source
from rookworld.evaluate import EvalConfig, complete
from rookworld.hub import load_model, resolve_default_model
from rookworld.rewards import RewardConfig, score_batch
from rookworld.stockfish import StockfishPool


def parse_config(spec: str) -> RewardConfig:
    types = {f.name: f.type for f in dataclasses.fields(RewardConfig)}
    values: dict[str, object] = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if name not in types:
            raise SystemExit(f"--config {spec!r}: unknown field {name!r}; known: {sorted(types)}")
        values[name] = value if name == "best_move_shape" else float(value)
    return RewardConfig(**values)


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Rank correlation (ties share their mean rank); None when y is constant, 0 when only x is."""
    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        return np.array([r[v == value].mean() for value in v])

    if len(y) < 2 or np.ptp(y) == 0:
        return None
    if np.ptp(x) == 0:
        return 0.0
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def mean_spearman(groups: list[np.ndarray], truths: list[np.ndarray], masks: list[np.ndarray]) -> tuple[float, int]:
    values = [spearman(r[m], -t[m]) for r, t, m in zip(groups, truths, masks)]
    defined = [v for v in values if v is not None]
    return (float(np.mean(defined)) if defined else float("nan")), len(defined)


def variance_shares(groups: list[np.ndarray], legal: list[np.ndarray]) -> tuple[float, float, float]:
    """Shares of the summed within-group sum of squares: (illegal vs legal, among legal, among illegal)."""
    between = among_legal = among_illegal = 0.0
    for r, ok in zip(groups, legal):
        mean = r.mean()
        for part in (r[ok], r[~ok]):
            if len(part):
                between += len(part) * (part.mean() - mean) ** 2
        among_legal += float(((r[ok] - r[ok].mean()) ** 2).sum()) if ok.any() else 0.0
        among_illegal += float(((r[~ok] - r[~ok].mean()) ** 2).sum()) if (~ok).any() else 0.0
    total = between + among_legal + among_illegal
    return tuple(part / total if total else float("nan") for part in (between, among_legal, among_illegal))


def rows_of(rewards: np.ndarray, truth: np.ndarray, legal: np.ndarray) -> dict[str, float]:
    """The table rows of one reward (N, k) against the true loss (N, k) and legality (N, k)."""
    groups, truths, masks = list(rewards), list(truth), list(legal)
    rho_legal, n_legal = mean_spearman(groups, truths, masks)
    rho_all, n_all = mean_spearman(groups, truths, [np.ones_like(m) for m in masks])
    split, among_legal, among_illegal = variance_shares(groups, masks)
    return {"mean": rewards.mean(), "std": rewards.std(), "groups all equal": float(np.mean(np.ptp(rewards, 1) == 0)),
            f"Spearman vs -loss, legal ({n_legal} groups)": rho_legal,
            f"Spearman vs -loss, all ({n_all} groups)": rho_all,
            "SS share: illegal vs legal": split, "SS share: among legal": among_legal,
            "SS share: among illegal": among_illegal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--prompts", type=int, default=150, help="P prompts of the embedded eval split")
    parser.add_argument("--k", type=int, default=8, help="completions per prompt (a GRPO group)")
    parser.add_argument("--seed", type=int, default=0, help="prompt choice and sampling seed")
    parser.add_argument("--cache", help="SQLite file for Stockfish results (reruns skip the searches)")
    parser.add_argument("--config", action="append", default=[], help="a RewardConfig to compare: field=value,...")
    args = parser.parse_args()
    torch.set_num_threads(1)

    configs = {"default": RewardConfig()}
    configs.update((spec, parse_config(spec)) for spec in args.config)
    samples = [s for s in load_source("embedded", "eval").samples if s.task == "P"]
    samples = random.Random(args.seed).sample(samples, min(args.prompts, len(samples)))
    start = time.perf_counter()
    model, tokenizer = load_model(resolve_default_model())
    groups = complete(model, tokenizer, samples, EvalConfig(samples=args.k, temperature=1.0, seed=args.seed))
    sampled = time.perf_counter()
    flat = [(s, c) for s, group in zip(samples, groups) for c in group]
    with StockfishPool(processes=1, cache_path=args.cache) as pool:
        truth = quality.judge_moves(pool, [(s.fen, text.parse_p_completion(c).best) for s, c in flat])
        scores = {name: score_batch([(s.prompt, c, s.analysis) for s, c in flat], pool, config)
                  for name, config in configs.items()}
    shape = (len(samples), args.k)
    loss = np.array([q.score_loss for q in truth]).reshape(shape)
    legal = np.array([q.legal for q in truth]).reshape(shape)
    print(f"{len(samples)} P prompts x {args.k} completions, seed {args.seed}: sampled in {sampled - start:.0f} s, "
          f"scored in {time.perf_counter() - sampled:.0f} s; legal B: moves {legal.mean():.3f}, mean true "
          f"expected-score loss of the legal ones {loss[legal].mean():.3f}; bands "
          + ", ".join(f"{band} {share:.3f}" for band, share in quality.band_shares(truth).items()))
    for name, config in configs.items():
        print(f"  {name}: {config}")
    names = list(configs)
    # the truth as a reward: how much of its own variance legality explains is what a reward should match
    truth_rows = rows_of(-loss, loss, legal)
    print("\n| value | metric | " + " | ".join(names) + " | -true loss |")
    print("|---|---|" + "---:|" * (len(names) + 1))
    for value, key in (("best_move", "best_move"), ("P reward", None)):
        table = {name: rows_of(np.array([s.components[key] if key else s.reward for s in got]).reshape(shape),
                               loss, legal) for name, got in scores.items()}
        for metric in table["default"]:
            cells = [table[name][metric] for name in names]
            print(f"| {value} | {metric} | " + " | ".join(f"{c:.3f}" for c in cells) + f" | {truth_rows[metric]:.3f} |")


if __name__ == "__main__":
    main()
