"""Held-out metrics of P and A completions: pure functions of (sample, completion) pairs.

Every per-sample metric is a fraction in [0, 1] (averaged over the samples it applies to) except
`P/eval_mae`, `P/acpl`, `P/acpl_legal`, `P/acpl@k` and `P/acpl@vote`, in pawns. docs/grpo.md defines each one;
`rookworld eval` and the GRPO trainer's periodic evaluation both report these names, each with its standard error
(`NAME/se`, clustered by game where the prompts name their game) and the number of prompts it is averaged
over (`NAME/n`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rapidfuzz.distance import Levenshtein

from rookworld import text
from rookworld.analysis import clip_pawns
from rookworld.arbiter import legal_move
from rookworld.data.cases import classify_p, mating_moves
from rookworld.data.record import Sample
from rookworld.quality import BANDS, MoveQuality
from rookworld.rewards import Score, p_board

FEN_FIELDS = 6
# A cases whose exact accuracy is reported on its own (meta.case, from data.cases).
A_CASE_METRICS = ("first_move", "checkmate", "stalemate", "illegal")
# P metrics also reported, as NAME/check, on the positions whose side to move is in check (data.cases.classify_p):
# the base model's move is illegal in most of them, and GRPO has lost ground there while gaining elsewhere.
P_CHECK_METRICS = ("P/acpl", "P/best_move_legal", "P/best_move_acc")
SE_SUFFIX, N_SUFFIX = "/se", "/n"  # NAME/se, NAME/n: a metric's standard error and its number of prompts
# NAME/delta, NAME/delta/se: a model's difference from another on the same prompts, and its paired SE
DELTA_SUFFIX = "/delta"
BAND_PREFIX = "P/band/"  # P/band/<name>: share of B: moves in each move-quality band (quality.BANDS)
# Best of a prompt's k completions, reported as NAME@k: pass@k for the rates, the smallest loss for P/acpl.
BEST_OF: dict[str, Callable[[Sequence[float]], float]] = {"P/best_move_acc": max, "A/exact": max, "P/acpl": min}
# The completion a vote of a prompt's k completions picks (player.vote, maj@k: no truth needed to choose), NAME@vote.
VOTED = ("P/best_move_acc", "P/best_move_legal", "P/acpl", "P/expected_score_loss")
# Metrics where a lower value is better: losses, errors and the shares of bad moves; every other one is a rate or
# score where higher is better. Checkpoint selection (`rookworld sft --best-metric`) reads the direction here.
LOWER_IS_BETTER = ("loss", "P/eval_mae", "P/acpl", "P/acpl_legal", "P/expected_score_loss", "A/false_illegal",
                   f"{BAND_PREFIX}inaccuracy", f"{BAND_PREFIX}mistake", f"{BAND_PREFIX}blunder")


def lower_is_better(name: str) -> bool:
    """Whether a lower value of the logged metric `name` is better: one of LOWER_IS_BETTER with any prefix
    (eval/) and variant (/P, /check, @k, @vote, /delta) around it."""
    segments = "/" + name.split("@")[0] + "/"
    return any(f"/{base}/" in segments for base in LOWER_IS_BETTER)


def p_metrics(sample: Sample, completion: str) -> dict[str, float]:
    """One P completion's metrics; the truth is the sample's analysis (best first)."""
    analysis = sample.analysis
    assert analysis is not None, "a P sample carries its analysis"
    parsed = text.parse_p_completion(completion)
    board = p_board(sample.prompt)
    played = legal_move(board, parsed.best)  # as move quality reads it: king-takes-rook castling included
    best = played.uci() if played else None  # the B: move in standard UCI; None when missing or illegal
    top = analysis.top5
    values = {
        "P/format_valid": float(not parsed.errors and parsed.best is not None and len(parsed.moves) == len(top)),
        "P/best_move_legal": float(played is not None),
        "P/best_move_acc": float(best is not None and best == analysis.best),
        "P/top5_overlap": len(set(parsed.moves) & set(top)) / max(1, len(top)),
    }
    # Where a best move is lost: not among the candidates, or listed and not chosen.
    listed = analysis.best in parsed.moves
    values["P/best_listed"] = float(listed)
    if listed:
        values["P/best_chosen"] = values["P/best_move_acc"]
    if parsed.moves and len(parsed.evals) == len(parsed.moves):
        highest = parsed.moves[parsed.evals.index(max(parsed.evals))]  # the first on a tie
        values["P/follows_evals"] = float(parsed.best == highest)
    mates = mating_moves(board)
    if mates:  # any mate counts, the engine's choice among several or not
        values["P/mate_in_one"] = float(best in mates)
    label = sample.meta.get("label_best")
    if label is not None:
        values["P/best_move_acc_label"] = float(best is not None and best == label)
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


def quality_metrics(quality: MoveQuality) -> dict[str, float]:
    """The metrics of one `B:` move's quality at the engine's truth (see quality.py)."""
    values = {"P/acpl": quality.loss, "P/expected_score_loss": quality.score_loss}
    if quality.legal:  # P/acpl without the cap of illegal moves: whether legal play itself got better
        values["P/acpl_legal"] = quality.loss
    values.update({f"{BAND_PREFIX}{name}": float(quality.band == name) for name, _ in BANDS})
    return values


def group_values(sample: Sample, completions: Sequence[str],
                 scores: Sequence[Score] | None = None) -> dict[str, list[float]]:
    """Each metric's values over one prompt's completions (a metric lists a value for each completion it
    applies to), with the training reward when `scores` (one per completion) are given."""
    values: dict[str, list[float]] = defaultdict(list)
    for i, completion in enumerate(completions):
        for name, value in sample_metrics(sample, completion).items():
            values[name].append(value)
        if scores is not None:
            values["reward/mean"].append(scores[i].reward)
            values[f"reward/{sample.task}"].append(scores[i].reward)
    return values


def add_check_metrics(sample: Sample, values: dict[str, list[float]]) -> None:
    """NAME/check, a copy of each P_CHECK_METRICS value of a P prompt whose side to move is in check."""
    if sample.task == "P" and classify_p(sample.fen) == "check":
        for name in P_CHECK_METRICS:
            if name in values:
                values[f"{name}/check"] = list(values[name])


def add_best_of(values: dict[str, list[float]], k: int) -> None:
    """NAME@k for each BEST_OF metric that a prompt's k completions all have."""
    for name, best in BEST_OF.items():
        if len(values.get(name, ())) == k:
            values[f"{name}@{k}"] = [best(values[name])]


def add_vote(sample: Sample, completions: Sequence[str], values: dict[str, list[float]]) -> None:
    """NAME@vote for each VOTED metric that a P prompt's k > 1 completions all have: its value for the completion
    whose `B:` move the vote picks."""
    from rookworld.player import vote

    if sample.task != "P" or len(completions) < 2:
        return
    index = vote(p_board(sample.prompt), completions)
    for name in VOTED:
        if len(values.get(name, ())) == len(completions):
            values[f"{name}@vote"] = [values[name][index]]


@dataclass(frozen=True)
class Estimate:
    """A metric's mean, its standard error and the number of prompts n it is averaged over."""

    mean: float
    se: float
    n: int


def estimate(groups: Sequence[Sequence[float]]) -> Estimate:
    """The mean of all values, grouped in clusters (a prompt's k completions, a game's positions: not
    independent draws), and its standard error clustered so: with cluster totals y_i over m_i values and
    r = sum(y) / sum(m), SE = sqrt(sum((y_i - r m_i)^2) / (n (n - 1))) / mean(m). With one value per
    cluster this is the sample std (n - 1 denominator) over sqrt(n); for a rate, sqrt(p (1 - p) / (n - 1)).
    NaN when n < 2; n is the number of clusters."""
    n = len(groups)
    totals = [sum(group) for group in groups]
    sizes = [len(group) for group in groups]
    mean = sum(totals) / sum(sizes)
    if n < 2:
        return Estimate(mean, math.nan, n)
    spread = sum((total - mean * size) ** 2 for total, size in zip(totals, sizes))
    return Estimate(mean, math.sqrt(spread / (n * (n - 1))) / (sum(sizes) / n), n)


def json_se(found: Estimate) -> float | None:
    """An estimate's SE for JSON: None where one cluster gives none."""
    return None if math.isnan(found.se) else found.se


def summarize(per_prompt: Sequence[Mapping[str, Sequence[float]]],
              clusters: Sequence[str | None] | None = None) -> dict[str, Estimate]:
    """The estimate of each metric over the prompts that have it; n counts those prompts. `clusters`
    names each prompt's game (None: a game of its own): the positions of one game are not independent,
    so the SE is clustered by game, as `estimate` clusters the completions of one prompt."""
    groups: dict[str, dict[object, list[float]]] = defaultdict(dict)
    prompts: dict[str, int] = defaultdict(int)
    for index, values in enumerate(per_prompt):
        cluster = clusters[index] if clusters is not None and clusters[index] is not None else index
        for name, group in values.items():
            if group:
                groups[name].setdefault(cluster, []).extend(group)
                prompts[name] += 1
    estimates = {}
    for name in sorted(groups):
        found = estimate(list(groups[name].values()))
        estimates[name] = Estimate(found.mean, found.se, prompts[name])
    return estimates


def flatten(estimates: Mapping[str, Estimate]) -> dict[str, float]:
    """NAME: mean, NAME/se, NAME/n for each metric: the flat form that logs and JSON files keep."""
    flat: dict[str, float] = {}
    for name, found in estimates.items():
        flat.update({name: found.mean, name + SE_SUFFIX: found.se, name + N_SUFFIX: found.n})
    return flat


def paired_delta(per_prompt: Sequence[Mapping[str, Sequence[float]]],
                 reference: Sequence[Mapping[str, Sequence[float]]],
                 clusters: Sequence[str | None] | None = None) -> dict[str, float]:
    """NAME/delta, NAME/delta/se and NAME/delta/n of each metric: the mean over the prompts where both have it
    of (this prompt's mean - the reference's on the same prompt), the SE of that paired difference, clustered
    by game as in `summarize`, and the number of those prompts. Pairing removes what the prompts share (how hard
    a position is), so the SE is the one to judge a change by; two independent SEs overstate it. A metric
    that only some completions have (P/best_chosen, P/eval_mae, ...) is paired on the prompts where both models
    have it, so its delta is not the difference of the two means when their n differ."""
    differences = [{name: [sum(values) / len(values) - sum(ref[name]) / len(ref[name])]
                    for name, values in mine.items() if values and ref.get(name)}
                   for mine, ref in zip(per_prompt, reference, strict=True)]
    flat: dict[str, float] = {}
    for name, found in summarize(differences, clusters).items():
        flat.update({name + DELTA_SUFFIX: found.mean, name + DELTA_SUFFIX + SE_SUFFIX: found.se,
                     name + DELTA_SUFFIX + N_SUFFIX: found.n})
    return flat


def is_statistic(name: str) -> bool:
    """Whether `name` is a metric's standard error, count or paired difference rather than a metric."""
    return name.endswith((SE_SUFFIX, N_SUFFIX, DELTA_SUFFIX))
