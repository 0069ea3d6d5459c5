"""One training/eval example, and how to build one from its truth.

P truth is a Stockfish-style analysis (moves best first); A truth is the arbiter's exact transition, so
an A sample's target is always `arbiter.a_target(arbiter.transition(...))`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rookworld import arbiter, text
from rookworld.analysis import Analysis
from rookworld.data.cases import classify_a
from rookworld.data.position import position_meta

TASKS = ("P", "A")
# How a P target lists its M:/E: candidates: shuffled together (RookWorld's own data), or in the engine's ranking,
# best first (so `B:` repeats the first `M:` move). Parsers, rewards and metrics read both.
ORDERS = ("shuffled", "best-first")


def display_order(ranked: Sequence[int], order: str) -> list[int]:
    """A P target's display order: `ranked` (a permutation of the ranked moves' indices) as it is for `shuffled`,
    sorted (the ranking) for `best-first`."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: choose one of {', '.join(ORDERS)}")
    return [int(i) for i in (sorted(ranked) if order == "best-first" else ranked)]


@dataclass(frozen=True)
class Sample:
    """`prompt + target` is the full RookWorld document; meta holds e.g. phase, move_number, case."""

    task: str
    prompt: str
    target: str
    analysis: Analysis | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def fen(self) -> str:
        """The position the prompt asks about."""
        body = self.prompt[len(text.P_PREFIX):] if self.task == "P" else self.prompt[len(text.A_PREFIX):]
        return body.split("+", 1)[0].strip()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"task": self.task, "prompt": self.prompt, "target": self.target}
        if self.analysis is not None:
            data["analysis"] = self.analysis.to_json()
        data["meta"] = self.meta
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Sample:
        task = data["task"]
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        analysis = data.get("analysis")
        return cls(task=task, prompt=str(data["prompt"]), target=str(data["target"]),
                   analysis=Analysis.from_json(analysis) if analysis else None, meta=dict(data.get("meta") or {}))


def p_sample(analysis: Analysis, order: Sequence[int] | None = None, meta: Mapping[str, Any] | None = None) -> Sample:
    """A P sample whose target lists the analysis' moves in `order` (indices into the ranked moves; the
    original data shuffles M and E together) and names the rank-1 move after `B:`."""
    if not analysis.moves:
        raise ValueError(f"position {analysis.fen!r} has no moves to list")
    order = range(len(analysis.moves)) if order is None else order
    moves = [analysis.moves[i] for i in order]
    evals = [analysis.evals[i] for i in order]
    target = text.p_target(analysis.fen, moves, evals, analysis.moves[0])
    return Sample("P", text.p_prompt(analysis.fen), target, analysis,
                  {**position_meta(analysis.fen), **(meta or {})})


def a_sample(prompt: str, meta: Mapping[str, Any] | None = None) -> Sample:
    """An A sample for `prompt` (with its `A: ` prefix): the target computed by the arbiter, meta.case
    named by `cases.classify_a`.

    Raises errors.InvalidPromptError for a malformed prompt, bad FEN or unparseable move.
    """
    parsed = text.parse_a_prompt(prompt)
    transition = arbiter.transition(parsed.fen, parsed.move, parsed.history)
    case = classify_a(parsed.fen, parsed.move, transition)
    return Sample("A", prompt, arbiter.a_target(transition), None,
                  {**position_meta(parsed.fen), **(meta or {}), "case": case})
