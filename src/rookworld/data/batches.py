"""Training batches with a fixed P:A mix, optional filters, seeded, and resumable exactly.

Each task's samples are visited in epochs, each epoch a permutation fixed by (seed, task, epoch), so a
sample repeats only after all of its task have been seen. The number of P samples in a batch of B is
floor(B * p_fraction + u), u uniform in [0, 1) from the sampler's own generator: exactly B * p_fraction
on average and within one of it in every batch. A batch lists its P samples first, then its A samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rookworld.data.position import PHASES
from rookworld.data.record import TASKS, Sample
from rookworld.errors import UserError


@dataclass(frozen=True)
class SampleFilter:
    """Which samples may be drawn; None means any. Phases follow `position.game_phase`."""

    tasks: tuple[str, ...] | None = None
    phases: tuple[str, ...] | None = None
    min_move: int | None = None
    max_move: int | None = None

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks or () if t not in TASKS] + [p for p in self.phases or () if p not in PHASES]
        if unknown:
            raise UserError(f"unknown task or phase in the sample filter: {unknown}; tasks are {TASKS}, "
                            f"phases are {PHASES}")
        if self.min_move is not None and self.max_move is not None and self.min_move > self.max_move:
            raise UserError(f"sample filter: min_move {self.min_move} > max_move {self.max_move}")

    def accepts(self, sample: Sample) -> bool:
        move = sample.meta.get("move_number", 1)
        return ((self.tasks is None or sample.task in self.tasks)
                and (self.phases is None or sample.meta.get("phase") in self.phases)
                and (self.min_move is None or move >= self.min_move)
                and (self.max_move is None or move <= self.max_move))


class TaskSampler:
    def __init__(self, samples: Sequence[Sample], p_fraction: float = 0.5, seed: int = 0,
                 sample_filter: SampleFilter | None = None) -> None:
        if not 0.0 <= p_fraction <= 1.0:
            raise UserError(f"p_fraction must be in [0, 1], got {p_fraction}")
        self.samples = samples
        self.p_fraction = p_fraction
        self.seed = seed
        self.filter = sample_filter or SampleFilter()
        self.pools = {task: [i for i, s in enumerate(samples) if s.task == task and self.filter.accepts(s)]
                      for task in TASKS}
        needed = [t for t, share in (("P", p_fraction), ("A", 1.0 - p_fraction)) if share > 0 and not self.pools[t]]
        if needed:
            raise UserError(f"the P:A mix (p_fraction={p_fraction}) needs {' and '.join(needed)} samples, but "
                            f"none of the {len(samples)} samples pass the filter {self.filter}")
        self._rng = np.random.default_rng(seed)
        self._epoch = {name: 0 for name in self.pools}
        self._cursor = {name: 0 for name in self.pools}
        self._orders: dict[str, tuple[int, np.ndarray]] = {}  # pool -> (epoch, permutation of the pool)

    def _order(self, name: str) -> np.ndarray:
        """This epoch's visiting order of a pool."""
        epoch = self._epoch[name]
        if name not in self._orders or self._orders[name][0] != epoch:
            rng = np.random.default_rng([self.seed, list(self.pools).index(name), epoch])
            self._orders[name] = (epoch, rng.permutation(len(self.pools[name])))
        return self._orders[name][1]

    def _next_of(self, name: str) -> Sample:
        if self._cursor[name] == len(self.pools[name]):
            self._epoch[name] += 1
            self._cursor[name] = 0
        sample = self.samples[self.pools[name][self._order(name)[self._cursor[name]]]]
        self._cursor[name] += 1
        return sample

    def next(self, batch_size: int) -> list[Sample]:
        """The next `batch_size` samples: P samples first, then A samples."""
        if batch_size < 1:
            raise UserError(f"batch size must be at least 1, got {batch_size}")
        n_p = min(batch_size, math.floor(batch_size * self.p_fraction + self._rng.random()))
        return [self._next_of("P") for _ in range(n_p)] + [self._next_of("A") for _ in range(batch_size - n_p)]

    def state_dict(self) -> dict[str, Any]:
        return {**self._identity(), "epoch": dict(self._epoch), "cursor": dict(self._cursor),
                "rng": self._rng.bit_generator.state}

    def _identity(self) -> dict[str, Any]:
        """What a saved state must match."""
        return {"seed": self.seed, "p_fraction": self.p_fraction, "sizes": {t: len(p) for t, p in self.pools.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the sampler that saved `state` was (same samples, filter, seed and mix)."""
        mine = self._identity()
        theirs = {key: state.get(key) for key in mine}
        if theirs != mine:
            raise UserError(f"sampler state was saved for {theirs}, but this sampler has {mine}: "
                            "resume with the same data, filter, seed and p_fraction")
        self._epoch = dict(state["epoch"])
        self._cursor = dict(state["cursor"])
        self._rng.bit_generator.state = state["rng"]


def task_picks(tasks: Sequence[str], counts: dict[str, int], seed: int = 0) -> list[int]:
    """Indices of counts[task] rows of each task ("P", then "A") drawn at random without replacement (seeded),
    each task's in ascending order; `tasks` is the task of each row."""
    rng = np.random.default_rng(seed)
    picks = []
    for task in ("P", "A"):
        rows = [i for i, t in enumerate(tasks) if t == task]
        picks += [rows[j] for j in sorted(rng.choice(len(rows), size=counts.get(task, 0), replace=False).tolist())]
    return picks


def balanced_subset(samples: Sequence[Sample], count: int, seed: int = 0) -> list[Sample]:
    """count/2 P and count/2 A samples drawn at random (seeded), all of one task when the other runs
    short. Random, not the first ones: generated files list each shard's rare A cases first."""
    sizes = {task: sum(s.task == task for s in samples) for task in ("P", "A")}
    n_p = min(sizes["P"], max(count // 2, count - sizes["A"]))
    counts = {"P": n_p, "A": min(count - n_p, sizes["A"])}
    return [samples[i] for i in task_picks([s.task for s in samples], counts, seed)]


def proportional_counts(tasks: Sequence[str], count: int) -> dict[str, int]:
    """How many of `count` rows (at most all) each task gets in proportion to its share of `tasks`: the
    floor of each share, the rows left over to the largest remainders (P first on a tie)."""
    count, total = min(count, len(tasks)), len(tasks)
    sizes = {task: sum(t == task for t in tasks) for task in ("P", "A")}
    counts = {task: count * n // total for task, n in sizes.items()}
    by_remainder = sorted(sizes, key=lambda task: -(count * sizes[task] % total))
    for task in by_remainder[:count - sum(counts.values())]:
        counts[task] += 1
    return counts
