"""Rewards of P and A completions: pure functions of (prompt, completion, truth) -> Score.

Every reward is a weighted sum of named components (the WEIGHTS table below; P's weights and the shape
of its best_move credit come from a RewardConfig), clipped to [-1, 1]. The exact target scores 1.0; a
malformed completion scores low and never raises. P truth is Stockfish's stored analysis; only moves
it does not cover are evaluated on demand (score_batch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import chess

from rookworld import arbiter, quality, text
from rookworld.analysis import EVAL_CLIP_PAWNS, Analysis, clip_pawns
from rookworld.errors import InvalidPromptError

if TYPE_CHECKING:
    from rookworld.stockfish import StockfishPool

UNKNOWN_SHARE = 0.5  # an uncovered move of unknown eval gets this share of the last stored move's credit
BEST_MOVE_SHAPES = ("linear", "exp")


@dataclass(frozen=True)
class RewardConfig:
    """P weights and the shape of the best_move credit. The weights sum to 1, so the exact target scores 1.0."""

    p_best_move_weight: float = field(default=0.5, metadata={
        "help": "P weight of best_move, the quality of the B: move: the move the model would play is what the "
                "P task is for"})
    p_candidates_weight: float = field(default=0.2, metadata={
        "help": "P weight of candidates, the top-5 moves named: a denser signal than one move"})
    p_evals_weight: float = field(default=0.2, metadata={
        "help": "P weight of evals, their error: calibrated evals make the candidate ranking meaningful"})
    p_format_weight: float = field(default=0.1, metadata={
        "help": "P weight of format: small, as every other component already needs a parseable completion"})
    best_move_shape: str = field(default="exp", metadata={
        "help": "best_move credit of a legal move from its expected-score loss L against the best move (the "
                "Lichess win%% curve): 'linear' max(0, 1 - L / scale) or 'exp' exp(-L / scale)"})
    best_move_scale: float = field(default=0.2, metadata={
        "help": "expected-score loss (0..1) at which the linear credit reaches 0, or that divides it by e "
                "for 'exp'"})
    best_move_illegal: float = field(default=-0.25, metadata={
        "help": "best_move credit of an illegal, unparseable or missing move, below every legal move's (< 0)"})
    reward_warmup_steps: int = field(default=0, metadata={
        "help": "training steps over which every task's component weights move linearly from a warm-up "
                "weighting that favours format and structure to the configured weights (0: off)"})

    def __post_init__(self) -> None:
        weights = self.p_weights
        checks = [
            (all(w >= 0 for w in weights.values()), f"P weights must be >= 0, got {weights}"),
            (math.isclose(math.fsum(weights.values()), 1.0, abs_tol=1e-9),
             f"P weights must sum to 1 so that the exact target scores 1.0, got {math.fsum(weights.values())}"),
            (self.best_move_shape in BEST_MOVE_SHAPES,
             f"best_move_shape must be one of {BEST_MOVE_SHAPES}, got {self.best_move_shape!r}"),
            (self.best_move_scale > 0,
             f"best_move_scale must be > 0 (it divides the loss), got {self.best_move_scale}"),
            (-1.0 <= self.best_move_illegal < 0.0,
             f"best_move_illegal must be in [-1, 0): below every legal move's credit (>= 0) and a component's "
             f"range, got {self.best_move_illegal}"),
            (self.reward_warmup_steps >= 0, f"reward_warmup_steps must be >= 0 (0: off), "
                                            f"got {self.reward_warmup_steps}"),
        ]
        for ok, reason in checks:
            if not ok:
                raise ValueError(reason)

    @property
    def p_weights(self) -> dict[str, float]:
        return {"best_move": self.p_best_move_weight, "candidates": self.p_candidates_weight,
                "evals": self.p_evals_weight, "format": self.p_format_weight}


DEFAULT_CONFIG = RewardConfig()

# Component weights per task (P's from the default RewardConfig); each task's weights sum to 1, so the
# exact target scores 1.0.
WEIGHTS: dict[str, dict[str, float]] = {
    "P": DEFAULT_CONFIG.p_weights,
    "A": {
        "exact": 0.2,        # the truth is known exactly; near misses must stay clearly below it
        "placement": 0.3,    # the board is most of the state and the hardest part to track
        "side": 0.05,        # each of the five other FEN fields is one rule of state keeping
        "castling": 0.05,
        "en_passant": 0.05,
        "halfmove": 0.05,
        "fullmove": 0.05,
        "reward": 0.1,       # the outcome the environment reports (legal, mate, draw, illegal)
        "flags": 0.05,       # terminated/truncated, largely implied by the reward
        "format": 0.1,       # parseable output
    },
}

# The reward warm-up's starting weights ("format and structure first, content later"): P's parseable
# five moves, five evals and a B: move before their quality; A's format, the reward/flags fields and the
# FEN's bookkeeping fields before the board itself and exactness.
WARMUP_WEIGHTS: dict[str, dict[str, float]] = {
    "P": {"best_move": 0.1, "candidates": 0.1, "evals": 0.1, "format": 0.7},
    "A": {"exact": 0.05, "placement": 0.1, "side": 0.05, "castling": 0.05, "en_passant": 0.05, "halfmove": 0.05,
          "fullmove": 0.05, "reward": 0.1, "flags": 0.1, "format": 0.4},
}

SIGN_ERROR_PAWNS = 1.0        # extra error when an eval has the wrong sign: the wrong side is better
MISSING_EVAL_PAWNS = 2 * EVAL_CLIP_PAWNS + SIGN_ERROR_PAWNS  # the largest possible error
EVAL_SCALE_PAWNS = 1.0        # evals credit = 1 / (1 + mae / scale): 0.5 at one pawn of mean error
FORMAT_ERROR_COST = 0.5       # format credit = 1 - cost * parse errors, down to -1
PLACEMENT_CHANGED_SHARE = 0.5  # placement credit share of the squares the move changes (copying the
                               # input board earns at most the other half)


@dataclass(frozen=True)
class Score:
    reward: float
    components: dict[str, float]


def _combine(weights: Mapping[str, float], components: dict[str, float]) -> Score:
    # over the weights' sum (1 up to rounding: 0.01 + 0.29 + 0.7 is not): the exact target scores 1.0 exactly
    total = math.fsum(weights[name] * value for name, value in components.items()) / math.fsum(weights.values())
    return Score(reward=min(1.0, max(-1.0, total)), components=components)


def weights_at(config: RewardConfig, step: int) -> dict[str, dict[str, float]]:
    """Each task's component weights at training step `step` (0-based): WARMUP_WEIGHTS at step 0, moving
    linearly to the configured weights, which hold from step reward_warmup_steps on."""
    target = {"P": config.p_weights, "A": WEIGHTS["A"]}
    done = 1.0 if step >= config.reward_warmup_steps else step / config.reward_warmup_steps
    return {task: {name: (1 - done) * WARMUP_WEIGHTS[task][name] + done * weight for name, weight in weights.items()}
            for task, weights in target.items()}


def reweigh(components: dict[str, float], weights: Mapping[str, float]) -> float:
    """The reward of a completion's `components` under other `weights` (the reward warm-up)."""
    return _combine(weights, components).reward


def _format_credit(errors: Sequence[str]) -> float:
    return max(-1.0, 1.0 - FORMAT_ERROR_COST * len(errors))


# ---------------------------------------------------------------- P


@dataclass(frozen=True)
class _PView:
    """A P completion read against its position: parsed fields and the legality of each named move."""

    fen: str
    parsed: text.ParsedP
    legal: dict[str, bool]


def _same_position(fen_a: str, fen_b: str) -> bool:
    if fen_a.split()[:4] == fen_b.split()[:4]:
        return True
    try:  # writers differ on the en passant square when no capture is possible
        return chess.Board(fen_a).epd() == chess.Board(fen_b).epd()
    except ValueError:
        return False


@functools.lru_cache(maxsize=4096)
def _p_position(prompt: str) -> chess.Board:
    """The checked position of a P prompt, cached: a GRPO group scores G completions of one prompt.
    Shared between calls, so only ever read (is_legal), never pushed to."""
    if text.task_of(prompt) != "P":
        raise InvalidPromptError(f"not a P prompt (must start with {text.P_PREFIX!r}): {prompt[:100]!r}")
    board = arbiter.parse_fen(prompt[len(text.P_PREFIX):].strip())
    if not any(board.generate_legal_moves()):
        raise InvalidPromptError(f"P prompt of a position without legal moves (mate or stalemate): {prompt!r}")
    return board


def p_board(prompt: str) -> chess.Board:
    """The position of a P prompt; InvalidPromptError unless it is a legal position with a move to find."""
    return _p_position(prompt).copy(stack=False)


def _read_p(prompt: str, completion: str, analysis: Analysis) -> _PView:
    board = _p_position(prompt)
    fen = prompt[len(text.P_PREFIX):].strip()
    if not _same_position(fen, analysis.fen):
        raise ValueError(f"analysis of {analysis.fen!r} given for the prompt {prompt!r}")
    parsed = text.parse_p_completion(completion)
    parsed.moves = [_standard(board, move) for move in parsed.moves]
    parsed.best = None if parsed.best is None else _standard(board, parsed.best)
    named = [*parsed.moves, *([parsed.best] if parsed.best is not None else [])]
    legal = {move: _is_legal(board, move) for move in named}
    return _PView(fen=fen, parsed=parsed, legal=legal)


def _standard(board: chess.Board, token: str) -> str:
    """A legal move in the engine's UCI (king-takes-rook castling such as e1h1 read as e1g1, as move quality
    and the eval metrics read it); any other token as written."""
    move = arbiter.legal_move(board, token) if text.is_uci_shaped(token) else None
    return move.uci() if move is not None else token


def _is_legal(board: chess.Board, token: str) -> bool:
    if not text.is_uci_shaped(token):
        return False
    try:
        return board.is_legal(chess.Move.from_uci(token))
    except ValueError:  # UCI-shaped but not a move, e.g. a1a1
        return False


def _uncovered(view: _PView, analysis: Analysis) -> list[str]:
    return [move for move, ok in view.legal.items() if ok and move not in analysis.moves]


def uncovered_moves(prompt: str, completion: str, analysis: Analysis) -> list[str]:
    """Legal moves named in a P completion (M: or B:) that the analysis does not cover."""
    return _uncovered(_read_p(prompt, completion, analysis), analysis)


def _best_move_credit(view: _PView, analysis: Analysis, extra_evals: Mapping[str, float],
                      config: RewardConfig) -> float:
    best = view.parsed.best
    if best is None or not view.legal[best]:
        return config.best_move_illegal
    if not analysis.evals:  # nothing to compare with: the move is legal, that is all we know
        return UNKNOWN_SHARE
    # The stored search ranks every move it does not list at or below its last one; the bound also keeps an
    # on-demand eval (another depth) from outscoring the stored best.
    bound = min(analysis.evals)
    value = analysis.eval_of(best)
    if value is None:
        if best not in extra_evals:
            return UNKNOWN_SHARE * _dense_credit(config, analysis, bound)
        value = min(extra_evals[best], bound)
    return _dense_credit(config, analysis, value)


def _dense_credit(config: RewardConfig, analysis: Analysis, move_eval: float) -> float:
    """1.0 for the best move, falling with the expected-score loss against it; >= 0 for every legal move."""
    best = max(analysis.evals)
    loss = quality.judge(best, move_eval).score_loss
    if config.best_move_shape == "linear":
        return max(0.0, 1.0 - loss / config.best_move_scale)
    return math.exp(-loss / config.best_move_scale)


def _candidates_credit(view: _PView, analysis: Analysis) -> float:
    """(top-5 moves named - illegal moves named) / size of the top 5; repeats count once."""
    named = list(dict.fromkeys(view.parsed.moves))
    hits = sum(move in analysis.moves for move in named)
    illegal = sum(not view.legal[move] for move in named)
    return max(-1.0, (hits - illegal) / max(1, len(analysis.moves)))


def _evals_credit(view: _PView, analysis: Analysis, extra_evals: Mapping[str, float]) -> float:
    """1 / (1 + MAE / scale) over the named moves whose true eval is known; 0 when none is."""
    errors = []
    for i, move in enumerate(view.parsed.moves):
        truth = analysis.eval_of(move)
        if truth is None:
            truth = extra_evals.get(move) if view.legal[move] else None
        if truth is None:
            continue
        if i >= len(view.parsed.evals):
            errors.append(MISSING_EVAL_PAWNS)
            continue
        said = view.parsed.evals[i]
        wrong_sign = said * truth < 0
        errors.append(abs(clip_pawns(said) - clip_pawns(truth)) + (SIGN_ERROR_PAWNS if wrong_sign else 0.0))
    if not errors:
        return 0.0
    return 1.0 / (1.0 + (sum(errors) / len(errors)) / EVAL_SCALE_PAWNS)


def _score_p_view(view: _PView, analysis: Analysis, extra_evals: Mapping[str, float] | None,
                  config: RewardConfig | None) -> Score:
    extra = extra_evals or {}
    config = config or DEFAULT_CONFIG
    return _combine(config.p_weights, {
        "best_move": _best_move_credit(view, analysis, extra, config),
        "candidates": _candidates_credit(view, analysis),
        "evals": _evals_credit(view, analysis, extra),
        "format": _format_credit(view.parsed.errors),
    })


def score_p(prompt: str, completion: str, analysis: Analysis,
            extra_evals: Mapping[str, float] | None = None, config: RewardConfig | None = None) -> Score:
    """Reward of a P completion against Stockfish's analysis of the prompt's position.

    `extra_evals` maps moves outside the analysis to their evals (pawns, side to move's view), as
    StockfishPool.evaluate_moves gives them; without them such a move gets a smaller credit than the
    analysis's last move. `config` None is the default RewardConfig.
    """
    return _score_p_view(_read_p(prompt, completion, analysis), analysis, extra_evals, config)


# ---------------------------------------------------------------- A


def _squares(placement: str) -> list[str]:
    """64 squares of a FEN placement, a8 first: piece letter, '.' empty, '?' unknown.

    Ranks are read one by one, so a near miss (one wrong piece, a missing rank) keeps credit for the
    rest; a rank that does not describe exactly 8 squares is unknown as a whole.
    """
    squares: list[str] = []
    for rank in placement.split("/", 8)[:8]:
        row: list[str] = []
        for char in rank:
            if len(row) > 8:
                break
            if char in "12345678":
                row.extend("." * int(char))
            else:
                row.append(char if char in "pnbrqkPNBRQK" else "?")
        squares.extend(row if len(row) == 8 else ["?"] * 8)
    return squares + ["?"] * (64 - len(squares))


def _placement_credit(before: str, expected: str, said: str | None) -> float:
    """Share of right squares, the squares the move changes weighted apart from the rest."""
    if said is None:
        return 0.0
    old, new, got = _squares(before), _squares(expected), _squares(said)
    changed = [i for i in range(64) if old[i] != new[i]]
    kept = [i for i in range(64) if old[i] == new[i]]
    kept_right = sum(got[i] == new[i] for i in kept) / max(1, len(kept))
    if not changed:
        return kept_right
    changed_right = sum(got[i] == new[i] for i in changed) / len(changed)
    return PLACEMENT_CHANGED_SHARE * changed_right + (1 - PLACEMENT_CHANGED_SHARE) * kept_right


def score_a(prompt: str, completion: str, truth: arbiter.Transition | None = None) -> Score:
    """Reward of an A completion against the exact transition (computed by the arbiter when None)."""
    before = text.parse_a_prompt(prompt).fen
    if truth is None:
        truth = arbiter.transition_for_prompt(prompt)
    parsed = text.parse_a_completion(completion)
    expected = truth.fen.split(" ")
    said = parsed.fen.split(None, 6)[:6] if parsed.fen is not None else []  # bounded: completions can be huge
    said += [""] * (6 - len(said))

    def same(i: int) -> float:
        return float(said[i] == expected[i])

    flags = (str(int(truth.terminated)), str(int(truth.truncated)))
    return _combine(WEIGHTS["A"], {
        "exact": float(completion.strip() == arbiter.a_target(truth)),
        "placement": _placement_credit(before.split(" ")[0], expected[0], said[0] if parsed.fen else None),
        "side": same(1),
        "castling": same(2),
        "en_passant": same(3),
        "halfmove": same(4),
        "fullmove": same(5),
        "reward": float(parsed.reward == truth.reward),
        "flags": ((parsed.terminated == flags[0]) + (parsed.truncated == flags[1])) / 2,
        "format": _format_credit(parsed.errors),
    })


# ---------------------------------------------------------------- both


def score(task: str, prompt: str, completion: str, analysis: Analysis | None = None,
          extra_evals: Mapping[str, float] | None = None, config: RewardConfig | None = None) -> Score:
    if task == "P":
        if analysis is None:
            raise ValueError("a P reward needs Stockfish's analysis of the position; score_batch can compute it")
        return score_p(prompt, completion, analysis, extra_evals, config)
    if task == "A":
        return score_a(prompt, completion)
    raise ValueError(f"unknown task {task!r}; expected 'P' or 'A'")


def needs_engine(items: Sequence[tuple[str, str, Analysis | None]]) -> bool:
    """Whether score_batch would call the engine: a P item without analysis, or an uncovered move."""
    return any(text.task_of(prompt) == "P" and (analysis is None or uncovered_moves(prompt, completion, analysis))
               for prompt, completion, analysis in items)


def score_batch(items: Sequence[tuple[str, str, Analysis | None]], pool: StockfishPool | None,
                config: RewardConfig | None = None) -> list[Score]:
    """Scores of (prompt, completion, analysis) items, with at most two batched engine calls.

    P items without an analysis get one from `pool.analyse`; the legal moves that no analysis covers
    go to `pool.evaluate_moves` together. With `pool=None` every P item needs its analysis, and
    uncovered moves get the credit of an unknown eval.
    """
    tasks = [text.task_of(prompt) for prompt, _, _ in items]
    for task, (prompt, _, _) in zip(tasks, items):
        if task is None:
            raise InvalidPromptError(f"not a P or A prompt: {prompt[:100]!r}")
    analyses = [analysis for _, _, analysis in items]
    unanalysed = list(dict.fromkeys(prompt[len(text.P_PREFIX):].strip() for task, (prompt, _, analysis)
                                    in zip(tasks, items) if task == "P" and analysis is None))
    if unanalysed:
        if pool is None:
            raise ValueError(f"{len(unanalysed)} P prompts have no analysis and no Stockfish pool was given")
        found = dict(zip(unanalysed, pool.analyse(unanalysed)))
        analyses = [found[prompt[len(text.P_PREFIX):].strip()] if task == "P" and analysis is None else analysis
                    for task, (prompt, _, _), analysis in zip(tasks, items, analyses)]

    views = [_read_p(prompt, completion, analysis) if task == "P" else None
             for task, (prompt, completion, _), analysis in zip(tasks, items, analyses)]
    requests = list(dict.fromkeys((view.fen, move) for view, analysis in zip(views, analyses)
                                  if view is not None for move in _uncovered(view, analysis)))
    evaluated: dict[tuple[str, str], float] = {}
    if requests and pool is not None:
        evaluated = {request: value for request, value in zip(requests, pool.evaluate_moves(requests))
                     if value is not None}

    scores = []
    for view, analysis, (prompt, completion, _) in zip(views, analyses, items):
        if view is None:
            scores.append(score_a(prompt, completion))
        else:
            extra = {move: evaluated[(view.fen, move)] for move in view.legal if (view.fen, move) in evaluated}
            scores.append(_score_p_view(view, analysis, extra, config))
    return scores
