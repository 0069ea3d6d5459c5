"""Counts of a set of samples by task, A case, game phase and split (for `data stats` and manifests)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from rookworld.data.record import Sample
from rookworld.data.splits import EVAL_FRACTION, split_of


def tally(samples: Iterable[Sample], eval_fraction: float | None = EVAL_FRACTION) -> dict[str, Any]:
    """{"task": {P, A}, "case": {A cases}, "phase": {task: {phase: n}}, "split": {split: {task: n}}};
    the split by position is left out when `eval_fraction` is None (e.g. for hub data, split by the hub)."""
    task: Counter[str] = Counter()
    case: Counter[str] = Counter()
    phase: dict[str, Counter[str]] = {}
    split: dict[str, Counter[str]] = {}
    for sample in samples:
        task[sample.task] += 1
        if sample.task == "A":
            case[sample.meta.get("case", "unknown")] += 1
        phase.setdefault(sample.task, Counter())[sample.meta.get("phase", "unknown")] += 1
        if eval_fraction is not None:
            split.setdefault(split_of(sample.fen, eval_fraction), Counter())[sample.task] += 1
    counts: dict[str, Any] = {"task": dict(sorted(task.items())), "case": dict(case.most_common()),
                              "phase": {t: dict(sorted(c.items())) for t, c in sorted(phase.items())}}
    if eval_fraction is not None:
        counts["split"] = {s: dict(sorted(c.items())) for s, c in sorted(split.items())}
    return counts
