"""Training batches with a fixed P:A mix, optional filters, seeded, and resumable exactly.

Each task's samples are visited in epochs, each epoch a permutation fixed by (seed, task, epoch), so a
sample repeats only after all of its task have been seen. The number of P samples in a batch of B is
floor(B * p_fraction + u), u uniform in [0, 1) from the sampler's own generator: exactly B * p_fraction
on average and within one of it in every batch. A batch lists its P samples first, then its A samples.
With `a_cases` 'balanced' or 'sqrt', each A row first draws its case (`meta.case`: normal, castling,
first_move, ...) from the cases present, then the next sample of that case's own epochs: 'balanced' draws
every case equally often, 'sqrt' in proportion to the square root of its count (on the embedded set:
normal moves 76% -> 40% of A rows, illegal moves 6% -> 11%), between the data's own mix and 'balanced';
'illegal2' keeps the data's mix but counts illegal moves twice (6% -> 11%, the other cases in their own
proportions), from an estimate that GRPO's A groups push the legal/illegal choice toward "legal" two to one
(measured: it did not keep the illegal moves; docs/experiments.md).
With `p_cases` 'balanced' or 'sqrt' the P rows are drawn the same way by the position's case (`cases.classify_p`:
the side to move in check, or not): on the embedded set 7% of the P positions are checks, where the base model's
`B:` move is illegal three times in four; 'sqrt' draws them for 21% of the P rows (docs/experiments.md).
With `p_pool` N > 0 the P rows come from N positions drawn at random (seeded) once, so a run visits each of
them every N P rows instead of each position once, after 64 positions seen 25 times taught more than single
visits (measured in the default mix: the pooled positions are learnt, the unseen games no better; docs/experiments.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rookworld.data.cases import classify_p
from rookworld.data.position import PHASES
from rookworld.data.record import TASKS, Sample
from rookworld.errors import UserError

A_CASES = ("mix", "balanced", "sqrt", "illegal2")  # how A rows are drawn by case (module docstring)
P_CASES = ("mix", "balanced", "sqrt")  # how P rows are drawn by case
P_POOL_STREAM = 7919  # the P pool's random stream, apart from the epochs' and the batches'
CASE_WEIGHTS = {"balanced": lambda case, n: 1.0, "sqrt": lambda case, n: math.sqrt(n),
                "illegal2": lambda case, n: 2.0 * n if case == "illegal" else float(n)}


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
                 sample_filter: SampleFilter | None = None, a_cases: str = "mix", p_pool: int = 0,
                 p_cases: str = "mix") -> None:
        if not 0.0 <= p_fraction <= 1.0:
            raise UserError(f"p_fraction must be in [0, 1], got {p_fraction}")
        if a_cases not in A_CASES or p_cases not in P_CASES:
            raise UserError(f"a_cases must be one of {A_CASES} and p_cases one of {P_CASES}, got {a_cases!r}, "
                            f"{p_cases!r}")
        self.case_modes = {"A": a_cases, "P": p_cases}
        self.p_pool = p_pool
        self.samples = samples
        self.p_fraction = p_fraction
        self.seed = seed
        self.filter = sample_filter or SampleFilter()
        self.pools = {task: [i for i, s in enumerate(samples) if s.task == task and self.filter.accepts(s)]
                      for task in TASKS}
        if p_pool < 0 or p_pool > len(self.pools["P"]):
            raise UserError(f"p_pool must be 0 (every P sample) or 1 to the {len(self.pools['P'])} P samples that "
                            f"pass the filter, got {p_pool}")
        if p_pool:
            chosen = np.random.default_rng([seed, P_POOL_STREAM]).choice(len(self.pools["P"]), p_pool, replace=False)
            self.pools["P"] = [self.pools["P"][i] for i in sorted(chosen)]
        needed = [t for t, share in (("P", p_fraction), ("A", 1.0 - p_fraction)) if share > 0 and not self.pools[t]]
        if needed:
            raise UserError(f"the P:A mix (p_fraction={p_fraction}) needs {' and '.join(needed)} samples, but "
                            f"none of the {len(samples)} samples pass the filter {self.filter}")
        # pool names: the tasks, then when drawing by case one "A/<case>" pool per A case, in sorted order,
        # then the "P/<case>" pools (after A's, so that runs drawing A by case keep their pools' streams)
        self.cases: dict[str, list[str]] = {}
        self.case_p: dict[str, np.ndarray] = {}
        for task in ("A", "P"):
            by_case: dict[str, list[int]] = {}
            for i in self.pools[task] if self.case_modes[task] != "mix" else []:
                by_case.setdefault(self._case_of(samples[i]), []).append(i)
            if not by_case:
                continue
            self.cases[task] = sorted(by_case)
            self.pools.update({f"{task}/{case}": by_case[case] for case in self.cases[task]})
            weights = np.array([CASE_WEIGHTS[self.case_modes[task]](c, len(by_case[c])) for c in self.cases[task]])
            self.case_p[task] = weights / weights.sum()  # each case's chance per row of the task
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

    @staticmethod
    def _case_of(sample: Sample) -> str:
        return sample.meta.get("case", "normal") if sample.task == "A" else classify_p(sample.fen)

    def _draw(self, task: str, count: int) -> list[Sample]:
        if task in self.cases:
            return [self._next_of(f"{task}/{self.cases[task][self._case(task)]}") for _ in range(count)]
        return [self._next_of(task) for _ in range(count)]

    def _case(self, task: str) -> int:
        if self.case_modes[task] == "balanced":  # uniform, as before 'sqrt' existed: the same seed draws the same rows
            return int(self._rng.integers(len(self.cases[task])))
        return int(self._rng.choice(len(self.cases[task]), p=self.case_p[task]))

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
        return self._draw("P", n_p) + self._draw("A", batch_size - n_p)

    def state_dict(self) -> dict[str, Any]:
        return {**self._identity(), "epoch": dict(self._epoch), "cursor": dict(self._cursor),
                "rng": self._rng.bit_generator.state}

    def _identity(self) -> dict[str, Any]:
        """What a saved state must match (the pool sizes name the A cases)."""
        return {"seed": self.seed, "p_fraction": self.p_fraction, "a_cases": self.case_modes["A"],
                "p_cases": self.case_modes["P"], "p_pool": self.p_pool,
                "sizes": {t: len(p) for t, p in self.pools.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the sampler that saved `state` was (same samples, filter, seed, mix and
        A cases)."""
        mine = self._identity()
        # states saved before 'sqrt' existed name no a_cases: their case pools say 'balanced'
        legacy = "balanced" if any(name.startswith("A/") for name in state.get("sizes", {})) else "mix"
        theirs = ({key: state.get(key) for key in mine}
                  | {"a_cases": state.get("a_cases", legacy), "p_cases": state.get("p_cases", "mix"),
                     "p_pool": state.get("p_pool", 0)})
        if theirs != mine:
            raise UserError(f"sampler state was saved for {theirs}, but this sampler has {mine}: "
                            "resume with the same data, filter, seed, p_fraction, A and P cases (--a-cases, "
                            "--p-cases) and P pool (--p-pool)")
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
