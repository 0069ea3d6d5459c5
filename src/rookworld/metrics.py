"""Held-out metrics of P and A completions: pure functions of (sample, completion) pairs.

Every per-sample metric is a fraction in [0, 1] (averaged over the samples it applies to) except
`P/eval_mae`, in pawns. The README defines each one; `rookworld eval` and the GRPO trainer's periodic
evaluation both report these names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rapidfuzz.distance import Levenshtein

from rookworld import text
from rookworld.analysis import clip_pawns
from rookworld.data.record import Sample
from rookworld.rewards import Score, p_board

FEN_FIELDS = 6
# A cases whose exact accuracy is reported on its own (meta.case, from data.cases).
A_CASE_METRICS = ("first_move", "checkmate", "stalemate", "illegal")


def p_metrics(sample: Sample, completion: str) -> dict[str, float]:
    """One P completion's metrics; the truth is the sample's analysis (best first)."""
    analysis = sample.analysis
    assert analysis is not None, "a P sample carries its analysis"
    parsed = text.parse_p_completion(completion)
    board = p_board(sample.prompt)
    legal_moves = {move.uci() for move in board.legal_moves}
    best = parsed.best
    top = analysis.moves[:5]
    values = {
        "P/format_valid": float(not parsed.errors and best is not None and len(parsed.moves) == len(top)),
        "P/best_move_legal": float(best in legal_moves),
        "P/best_move_acc": float(best is not None and best == analysis.best),
        "P/top5_overlap": len(set(parsed.moves) & set(top)) / max(1, len(top)),
    }
    label = sample.meta.get("label_best")
    if label is not None:
        values["P/best_move_acc_label"] = float(best == label)
    errors = [abs(clip_pawns(said) - clip_pawns(truth))
              for move, said in zip(parsed.moves, parsed.evals)
              if (truth := analysis.eval_of(move)) is not None]
    if errors:
        values["P/eval_mae"] = sum(errors) / len(errors)
    return values


def a_metrics(sample: Sample, completion: str) -> dict[str, float]:
    """One A completion's metrics against the sample's exact target."""
    truth = text.parse_a_completion(sample.target)
    parsed = text.parse_a_completion(completion)
    expected_fields = (truth.fen or "").split(" ")
    said_fields = (parsed.fen or "").split()
    field_hits = sum(a == b for a, b in zip(said_fields, expected_fields))
    exact = float(completion.strip() == sample.target)
    values = {
        "A/format_valid": float(not parsed.errors),
        "A/exact": exact,
        "A/fen_exact": float(parsed.fen == truth.fen),
        "A/fen_field_acc": field_hits / FEN_FIELDS,
        "A/similarity": Levenshtein.normalized_similarity(completion.strip(), sample.target),
        "A/reward_acc": float(parsed.reward == truth.reward),
        "A/terminated_acc": float(parsed.terminated == truth.terminated),
        "A/truncated_acc": float(parsed.truncated == truth.truncated),
    }
    case = sample.meta.get("case")
    if case in A_CASE_METRICS:
        values[f"A/exact/{case}"] = exact
    if truth.truncated == "0":  # a legal move: calling it illegal (truncated) is the A task's commonest slip
        values["A/false_illegal"] = float(parsed.truncated == "1")
    return values


def sample_metrics(sample: Sample, completion: str) -> dict[str, float]:
    return p_metrics(sample, completion) if sample.task == "P" else a_metrics(sample, completion)


def aggregate(samples: Sequence[Sample], completions: Sequence[str],
              scores: Sequence[Score] | None = None) -> dict[str, float]:
    """Mean of each metric over the samples it applies to, rewards by task, and counts per task."""
    if len(samples) != len(completions):
        raise ValueError(f"{len(samples)} samples but {len(completions)} completions")
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)

    def add(name: str, value: float) -> None:
        sums[name] += value
        counts[name] += 1

    for i, (sample, completion) in enumerate(zip(samples, completions)):
        for name, value in sample_metrics(sample, completion).items():
            add(name, value)
        if scores is not None:
            add("reward/mean", scores[i].reward)
            add(f"reward/{sample.task}", scores[i].reward)
    result = {name: sums[name] / counts[name] for name in sorted(sums)}
    for task in ("P", "A"):
        result[f"count/{task}"] = float(sum(s.task == task for s in samples))
    return result


def pass_at_n(samples: Sequence[Sample], completions: Sequence[Sequence[str]]) -> dict[str, float]:
    """Fraction of prompts with at least one right answer among their n sampled completions:
    `P/best_move_acc@n` and `A/exact@n` (n = completions per prompt)."""
    hits: dict[str, list[float]] = defaultdict(list)
    for sample, group in zip(samples, completions):
        key, metric = ("P/best_move_acc", p_metrics) if sample.task == "P" else ("A/exact", a_metrics)
        hits[f"{key}@{len(group)}"].append(float(any(metric(sample, c)[key] for c in group)))
    return {name: sum(v) / len(v) for name, v in sorted(hits.items())}
