"""Counts of a set of samples by task, A case, game phase and split (for `data stats` and manifests)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from rookworld.data.position import position_key
from rookworld.data.record import Sample
from rookworld.data.splits import EVAL_FRACTION, sample_split


def tally(samples: Iterable[Sample], eval_fraction: float | None = EVAL_FRACTION) -> dict[str, Any]:
    """{"task": {P, A}, "case": {A cases}, "phase": {task: {phase: n}}, "split": {split: {task: n}},
    "eval_positions_in_train": {task: n}}; the split (by game, else by position: splits.py) is left out
    when `eval_fraction` is None (e.g. for hub data, split by the hub).

    eval_positions_in_train counts the eval samples (by task) whose position (FEN without move counters)
    some train sample of `samples` also asks about: 0 for a split by position, and the openings and
    common endgames that a train game and an eval game share for a split by game. Nothing is dropped.
    """
    task: Counter[str] = Counter()
    case: Counter[str] = Counter()
    phase: dict[str, Counter[str]] = {}
    split: dict[str, Counter[str]] = {}
    train_positions: set[str] = set()
    eval_positions: list[tuple[str, str]] = []  # (task, position key) of every eval sample
    for sample in samples:
        task[sample.task] += 1
        if sample.task == "A":
            case[sample.meta.get("case", "unknown")] += 1
        phase.setdefault(sample.task, Counter())[sample.meta.get("phase", "unknown")] += 1
        if eval_fraction is not None:
            side = sample_split(sample, eval_fraction)
            split.setdefault(side, Counter())[sample.task] += 1
            if side == "train":
                train_positions.add(position_key(sample.fen))
            else:
                eval_positions.append((sample.task, position_key(sample.fen)))
    counts: dict[str, Any] = {"task": dict(sorted(task.items())), "case": dict(case.most_common()),
                              "phase": {t: dict(sorted(c.items())) for t, c in sorted(phase.items())}}
    if eval_fraction is not None:
        counts["split"] = {s: dict(sorted(c.items())) for s, c in sorted(split.items())}
        overlap = Counter({t: 0 for t in task})
        overlap.update(t for t, key in eval_positions if key in train_positions)
        counts["eval_positions_in_train"] = dict(sorted(overlap.items()))
    return counts
