"""Rows of data files and hub datasets -> samples.

A row is a RookWorld text line (`P: ...` or an A line with or without `A: `), or a record: `{"text": line}`,
an exported sample (`task`, `prompt`, `target`, optional `analysis` and `meta`) or a compact record of
generated data. A row that cannot be used raises ValueError (KeyError/TypeError for a record of the
wrong shape): a P row's position must be legal and its moves distinct and legal there.

P truth is the analysis the row states: its moves ranked by eval, best first (the data shuffles M and E),
with `limit="data"`; the row's own B: label is kept as meta.label_best, because the original generator
wrote the 5th-ranked move for black. The P target stays the row's text. A truth is the arbiter's
transition; when the row states another target, the arbiter's is kept and the row's is recorded in
meta.stated_target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rookworld import text
from rookworld.analysis import Analysis, legal_analysis
from rookworld.data import store
from rookworld.data.position import position_meta
from rookworld.data.record import Sample, a_sample, p_sample

DATA_LIMIT = "data"  # Analysis.limit of an analysis read from a data row


def _p_analysis(line: str) -> tuple[Analysis, str | None]:
    """The ranked analysis that a full P line states, and its B: label."""
    parsed = text.parse_p_line(line)
    if parsed.errors:
        raise ValueError("; ".join(parsed.errors))
    assert parsed.fen is not None  # parse_p_line reports a missing FEN as an error
    analysis = Analysis(parsed.fen, tuple(parsed.moves), tuple(parsed.evals), DATA_LIMIT).ranked()
    return legal_analysis(analysis), parsed.best


def p_from_text(prompt: str, target: str, meta: Mapping[str, Any] | None = None) -> Sample:
    analysis, label = _p_analysis(prompt + target)
    return Sample("P", prompt, target, analysis,
                  {**position_meta(analysis.fen), "label_best": label, **(meta or {})})


def a_from_text(prompt: str, target: str | None, meta: Mapping[str, Any] | None = None) -> Sample:
    if not prompt.startswith(text.A_PREFIX):
        prompt = text.A_PREFIX + prompt
    sample = a_sample(prompt, meta)
    if target is not None and target.strip() != sample.target:
        return replace(sample, meta={**sample.meta, "stated_target": target.strip()})
    return sample


def from_line(line: str) -> Sample:
    task, prompt, target = text.split_line(line)
    return p_from_text(prompt, target) if task == "P" else a_from_text(prompt, target)


def from_record(record: Mapping[str, Any]) -> Sample:
    if not isinstance(record, Mapping):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if store.is_compact(record):  # the generator's own records: types checked, moves not replayed (30k a load)
        return store.decode(record)
    if "text" in record:
        return from_line(str(record["text"]))
    if "task" in record and "prompt" in record:
        task, prompt, target = record["task"], str(record["prompt"]), record.get("target")
        meta = record.get("meta") or {}
        if task == "A":
            return a_from_text(prompt, None if target is None else str(target), meta)
        if task == "P":
            if record.get("analysis"):
                analysis = legal_analysis(Analysis.from_json(record["analysis"]))
                if target is None:
                    return p_sample(analysis, meta=meta)
                return Sample("P", prompt, str(target), analysis, {**position_meta(analysis.fen), **meta})
            if target is None:
                raise ValueError("a P record needs a target or an analysis")
            return p_from_text(prompt, str(target), meta)
        raise ValueError(f"task must be 'P' or 'A', got {task!r}")
    raise ValueError(f"a record needs a 'text' field or 'task' and 'prompt' fields; got {sorted(record)[:6]}")
