"""The model as its own world: each move's next position, reward and end-of-game flags come from the model's greedy
A completion for `A: FEN+move+history+`, and the game goes on from the states it writes. The arbiter's transition for
the same prompt is the truth every completion is checked against.

A completion is exact when it is the A target's text (`arbiter.a_target`, as the metric A/exact compares it, outer
whitespace aside). Otherwise it diverges, of the first kind that applies, in this order:

- `malformed`: not `FEN+reward+terminated+truncated` with a FEN of six fields and eight ranks, one of the four
  rewards and flags 0 or 1 (`text.parse_a_completion` finds an error), or every field right but the text not the
  target's (stray whitespace inside it);
- `illegal move accepted`: the move is illegal in the FEN it was played in and the model's reward is not -1.0;
- `legal move refused`: the move is legal and the model's reward is -1.0;
- `wrong fen`: the model's new FEN is not the arbiter's (for a refused illegal move: not the unchanged FEN);
- `wrong reward`: the FEN is right, the reward is not (e.g. 0.001 for a mate);
- `wrong flags`: FEN and reward right, terminated or truncated not.

What the model's world makes of a completion (`after`): a malformed one, or a FEN python-chess rejects, or a position
without a legal move while the flags say the game goes on, leaves no state to play from, and the game ends there
(`world: unusable state`, scored as a draw). A reward of -1.0 (the move refused) ends it as an illegal move ends
self-play, the mover losing; a terminated or truncated flag ends it as the reward says (1.0: the mover mated; else a
draw). Otherwise the model's FEN is the next position, right or wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import chess

from rookworld.arbiter import ILLEGAL, WIN, Transition, a_target, parse_fen, transition_for_prompt
from rookworld.errors import InvalidPromptError
from rookworld.metrics import estimate, json_se
from rookworld.text import a_prompt, parse_a_completion

WORLDS = ("rules", "model")
MALFORMED = "malformed"
ILLEGAL_ACCEPTED = "illegal move accepted"
LEGAL_REFUSED = "legal move refused"
WRONG_FEN = "wrong fen"
WRONG_REWARD = "wrong reward"
WRONG_FLAGS = "wrong flags"
KINDS = (MALFORMED, ILLEGAL_ACCEPTED, LEGAL_REFUSED, WRONG_FEN, WRONG_REWARD, WRONG_FLAGS)
UNUSABLE = "world: unusable state"
REFUSED = "world: illegal move"
MATED = "world: checkmate"
DRAWN = "world: draw"
ENDS = (UNUSABLE, REFUSED, MATED, DRAWN)  # the terminations of a game the model's world ended


def divergence(truth: Transition, completion: str) -> str | None:
    """The kind of divergence of an A `completion` from the arbiter's `truth` (module docstring); None: exact."""
    if completion.strip() == a_target(truth):
        return None
    parsed = parse_a_completion(completion)
    if parsed.errors:
        return MALFORMED
    refused = parsed.reward == ILLEGAL
    if truth.reward == ILLEGAL and not refused:
        return ILLEGAL_ACCEPTED
    if truth.reward != ILLEGAL and refused:
        return LEGAL_REFUSED
    if parsed.fen != truth.fen:
        return WRONG_FEN
    if parsed.reward != truth.reward:
        return WRONG_REWARD
    if (parsed.terminated, parsed.truncated) != (str(int(truth.terminated)), str(int(truth.truncated))):
        return WRONG_FLAGS
    return MALFORMED  # every field right, the text not the target's


def after(completion: str, mover: chess.Color) -> tuple[chess.Board | None, chess.Outcome | None, str | None]:
    """The model's world after a move by `mover`: its next board (None when the game ended), else the game's
    outcome and termination (module docstring)."""
    parsed = parse_a_completion(completion)
    drawn = chess.Outcome(chess.Termination.VARIANT_DRAW, None)
    if parsed.errors:
        return None, drawn, UNUSABLE
    if parsed.reward == ILLEGAL:
        return None, chess.Outcome(chess.Termination.VARIANT_LOSS, not mover), REFUSED
    if "1" in (parsed.terminated, parsed.truncated):
        if parsed.reward == WIN:
            return None, chess.Outcome(chess.Termination.VARIANT_WIN, mover), MATED
        return None, drawn, DRAWN
    try:
        board = parse_fen(parsed.fen)
    except InvalidPromptError:
        return None, drawn, UNUSABLE
    if not any(board.legal_moves):
        return None, drawn, UNUSABLE
    return board, None, None


@dataclass
class Step:
    """One transition of a game in the model's world: the model's state, the move, its completion, the truth."""

    fen: str
    move: str
    completion: str
    truth: Transition
    kind: str | None  # `divergence`; None: exact


@dataclass
class Line:
    """A game's course in the model's world: every move (UCI, the opening included: the A prompts' history), the
    transitions the model made, how often each of its states stood (for the claimed draws), the move to send next."""

    moves: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    positions: Counter = field(default_factory=Counter)
    pending: chess.Move | None = None

    def first(self) -> int | None:
        """The index of the first diverging step; None when every step was exact."""
        return next((i for i, step in enumerate(self.steps) if step.kind is not None), None)

    def plies_to_divergence(self) -> int:
        """The exact transitions before the first divergence (censored: all of them, when none diverged)."""
        first = self.first()
        return len(self.steps) if first is None else first

    def record(self) -> dict:
        """The game's JSON record of its course in the model's world."""
        first = self.first()
        step = None if first is None else self.steps[first]
        return {"plies_to_divergence": self.plies_to_divergence(), "censored": step is None,
                "transitions": len(self.steps),
                "exact": sum(s.kind is None for s in self.steps),
                "divergence": None if step is None else {
                    "kind": step.kind, "fen": step.fen, "move": step.move, "completion": step.completion.strip(),
                    "target": a_target(step.truth)}}

    def stands(self, board: chess.Board) -> int:
        """Counts `board` as standing once more; how often it has stood (pieces, side, castling, en passant)."""
        key = " ".join(board.fen().split()[:4])
        self.positions[key] += 1
        return self.positions[key]


class World:
    """A model answering A prompts greedily, in one batched generation per call; the arbiter's target of each
    prompt bounds the completion's length (the target's tokens, EOS and a margin) and drafts it (the same greedy
    completion, fewer decoding steps)."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    def transitions(self, requests: Sequence[tuple[str, str, Sequence[str]]]) -> list[tuple[str, Transition]]:
        """For each (FEN, move, history ending with the move), the model's completion and the arbiter's truth."""
        from rookworld.generation import TARGET_MARGIN_TOKENS, SamplingSettings, generate_groups

        prompts = [a_prompt(fen, move, history) for fen, move, history in requests]
        truths = [transition_for_prompt(prompt) for prompt in prompts]
        eos = self.tokenizer.eos_id
        drafts = [self.tokenizer.encode(a_target(truth)) + [eos] for truth in truths]
        ids = self.tokenizer.encode_prompts(prompts)
        context = self.model.config.n_positions
        settings = [SamplingSettings(max_new_tokens=max(1, min(len(draft) + TARGET_MARGIN_TOKENS, context - len(p))))
                    for p, draft in zip(ids, drafts)]
        generation = generate_groups(self.model, ids, 1, settings, eos_id=eos, greedy=True, drafts=drafts)
        return list(zip(self.tokenizer.decode_batch(generation.completions()), truths))


def line_values(lines: Sequence[Line]) -> list[dict[str, list[float]]]:
    """Per game, the metrics `rookworld eval --world-games` reports (metrics.summarize's per-prompt form, one game
    a prompt): its plies to the first divergence, whether none came (censored), and each transition's exactness."""
    return [{"world/plies_to_divergence": [float(line.plies_to_divergence())],
             "world/censored": [float(line.first() is None)],
             "world/a_exact": [float(step.kind is None) for step in line.steps]} for line in lines]


def summary(lines: Sequence[Line]) -> dict:
    """The JSON totals of games in the model's world (see docs/play.md)."""
    plies = estimate([[float(line.plies_to_divergence())] for line in lines])
    stepped = [[float(step.kind is None) for step in line.steps] for line in lines if line.steps]
    exact = estimate(stepped) if stepped else None
    firsts = [line.steps[i].kind for line in lines if (i := line.first()) is not None]
    wrong = [step.kind for line in lines for step in line.steps if step.kind is not None]
    return {"plies_to_divergence": plies.mean, "plies_to_divergence_se": json_se(plies),
            "diverged": len(firsts), "censored": len(lines) - len(firsts),
            "a_exact": exact and exact.mean, "a_exact_se": exact and json_se(exact),
            "transitions": sum(len(line.steps) for line in lines),
            "first_divergences": {kind: firsts.count(kind) for kind in KINDS},
            "wrong_transitions": {kind: wrong.count(kind) for kind in KINDS}}


def describe(line: Line) -> str:
    """The PGN comment on a game's first divergence (or on its keeping to the rules), and its course after it."""
    first = line.first()
    if first is None:
        return f"the model's world kept to the rules for all {len(line.steps)} plies"
    step = line.steps[first]
    rest = [s.move for s in line.steps[first + 1:]]
    went_on = f"; it went on for {len(rest)} more plies: {' '.join(rest)}" if rest else ""
    return (f"world diverged at {step.move}, {first} plies after the opening: {step.kind}: the model wrote "
            f"{step.completion.strip()!r}, the rules say {a_target(step.truth)!r}{went_on}")
