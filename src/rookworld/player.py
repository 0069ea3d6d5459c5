"""The model as a chess player: for a position, its greedy `B:` move; when that move is illegal or
missing, a random legal move, or with the `listed` fallback the legal `M:` candidate its own `E:` evals
rate best (a random one when none is legal). Used by `rookworld play` and `rookworld uci` (`listed`).

With `votes` K > 1 the player samples K completions (temperature 1, the training temperature) instead of
the greedy one and acts on the one whose legal `B:` move the most of them name (self-consistency, maj@K):
the mode of the model's moves, which its greedy path often misses; `rookworld eval --samples K` reports
the same choice as NAME@vote.

With the `first` readout (readout.py) no completion decides the move: every legal move is scored by the
model's log-probability of writing it as its first `M:` candidate, and the highest is played (legal by
construction; a completion is generated only for the evals that `avoid_repetition` reads).

The prompt holds no history, so the model cannot know that a move repeats an earlier position; the
player can. With `avoid_repetition` (pawns) a player that rates the position at least that well (its
highest `E:` eval) plays, instead of a `B:` move that repeats a position, the best-rated legal `M:`
candidate that does not: repetition is a draw, which a side ahead should not take (engines' contempt).

The prompt is `P: <FEN>` encoded as training and evaluation encode it (after an EOS token); the
completion limit is `rookworld sample`'s default, which fits the model's context.
"""

from __future__ import annotations

import argparse
import functools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import chess

from rookworld.arbiter import legal_move
from rookworld.readout import best_first_candidate, first_candidate_scores, word_start_ids
from rookworld.text import ParsedP, p_prompt, parse_p_completion

FALLBACKS = ("random", "listed")
READOUTS = ("b", "first")  # the move: the B: of a generated completion, or the best-scored first M: candidate


@dataclass(frozen=True)
class Choice:
    """The move played, whether it is the model's own (its legal `B:` move or, avoiding a repetition, one of its
    `M:` candidates; False: the fallback replaced an illegal or missing `B:`), the model's raw completion, and the
    `B:` move set aside for repeating a position (None: none was)."""

    move: chess.Move
    own: bool
    completion: str
    avoided: chess.Move | None = None


def repeats(board: chess.Board, move: chess.Move) -> bool:
    """Whether `move` leads to a position that has stood on `board` before (python-chess's notion of the same
    position: pieces, side to move, castling and en passant rights)."""
    board.push(move)
    try:
        return board.is_repetition(2)
    finally:
        board.pop()


def best_listed(board: chess.Board, parsed: ParsedP, keep=lambda move: True) -> chess.Move | None:
    """The legal `M:` candidate with the highest `E:` eval among those `keep` accepts (the earlier on ties; one
    without an eval ranks last); None when none is."""
    listed = [(parsed.evals[i] if i < len(parsed.evals) else float("-inf"), i, move)
              for i, uci in enumerate(parsed.moves) if (move := legal_move(board, uci)) is not None and keep(move)]
    return max(listed, key=lambda item: (item[0], -item[1]))[2] if listed else None


def vote(board: chess.Board, completions: Sequence[str]) -> int:
    """The index of the completion whose `B:` move is the most frequent legal one among `completions` (on a
    tie, the move named first; the first completion naming it); 0 when none is legal, or there is one (greedy:
    nothing to count or parse)."""
    if len(completions) == 1:
        return 0
    moves = [move.uci() if (move := legal_move(board, parse_p_completion(c).best)) else None for c in completions]
    counts = Counter(move for move in moves if move is not None)
    if not counts:
        return 0
    most = max(counts.values())
    return next(i for i, move in enumerate(moves) if move is not None and counts[move] == most)


def choose_move(board: chess.Board, completion: str, rng: random.Random,
                avoid_repetition: float | None = None, fallback: str = "random") -> Choice:
    """The completion's `B:` move when it is legal on `board`, else the fallback: a uniformly random legal move
    drawn from `rng`, or (`listed`) the best-rated legal `M:` candidate when there is one. With `avoid_repetition`
    (pawns), a `B:` move that repeats a position is replaced by the best-rated legal `M:` candidate that does not,
    when the completion's highest `E:` eval is at least that (a side that is not ahead may take the draw).
    `board` must have a legal move."""
    parsed = parse_p_completion(completion)
    move = legal_move(board, parsed.best)
    if move is None:
        listed = best_listed(board, parsed) if fallback == "listed" else None
        return Choice(listed or rng.choice(list(board.legal_moves)), False, completion)
    if (avoid_repetition is not None and parsed.evals and max(parsed.evals) >= avoid_repetition
            and repeats(board, move)):
        other = best_listed(board, parsed, keep=lambda candidate: not repeats(board, candidate))
        if other is not None:
            return Choice(other, True, completion, avoided=move)
    return Choice(move, True, completion)


def choose_first(board: chess.Board, scores: dict[chess.Move, float], completion: str = "",
                 avoid_repetition: float | None = None) -> Choice:
    """The best-scored first candidate (`readout.first_candidate_scores`); with `avoid_repetition` (pawns), when
    it repeats a position and the completion's highest `E:` eval is at least that, the best-scored one that
    does not (if any)."""
    move = best_first_candidate(scores)
    if avoid_repetition is not None and repeats(board, move):
        evals = parse_p_completion(completion).evals
        other = best_first_candidate(scores, keep=lambda candidate: not repeats(board, candidate))
        if evals and max(evals) >= avoid_repetition and other is not None:
            return Choice(other, True, completion, avoided=move)
    return Choice(move, True, completion)


def add_readout_argument(parser: argparse.ArgumentParser, flag: str = "--readout", default: str = "b",
                         help: str | None = None) -> None:
    """`--readout b|first`, shared by `rookworld play` (also for its opponent) and `rookworld uci`."""
    parser.add_argument(flag, choices=READOUTS, default=default, help=help or (
        "how the model's move is read: b, the B: move of its completion (greedy, or the vote of --votes); "
        "first, every legal move scored by the model's log-probability of writing it as its first M: "
        f"candidate, the highest played (legal by construction) (default: {default})"))


def add_votes_argument(parser: argparse.ArgumentParser, default: int = 1) -> None:
    """`--votes K`, shared by `rookworld play` and `rookworld uci`."""
    parser.add_argument("--votes", type=int, default=default, metavar="K",
                        help="sample K completions a move at temperature 1 and play the legal B: move most of them "
                             f"name (the first named on a tie); 1: the greedy B: move (default: {default})")


def repetition_pawns(value: str) -> float | None:
    """An `--avoid-repetition` value: pawns, or `off` (None)."""
    if value.strip().lower() == "off":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: give the pawns (e.g. 1) or off") from None


def add_repetition_argument(parser: argparse.ArgumentParser, default: float | None = None,
                            flag: str = "--avoid-repetition", help: str | None = None) -> None:
    """`--avoid-repetition PAWNS|off`, shared by `rookworld play` (also for its opponent) and `rookworld uci`."""
    parser.add_argument(flag, type=repetition_pawns, default=default, metavar="PAWNS|off", help=help or (
        "when the model's highest E: eval is at least PAWNS, it does not play a B: move that repeats an earlier "
        "position if one of its legal M: candidates avoids it (the best-rated such candidate is played instead); "
        f"off: always B: (default: {'off' if default is None else f'{default:g}'})"))


class ModelPlayer:
    """A GPT-2 RookWorld model and its tokenizer, choosing moves greedily, or by a vote of `votes` sampled
    completions; random fallback moves draw from the stream `SEED/STREAM` (a second model in the same games
    draws from another), the samples from a torch stream seeded by `SEED/STREAM/votes`; `avoid_repetition` and
    `fallback` as in `choose_move`, applied to the completion chosen; `readout` `first`: `choose_first`."""

    def __init__(self, model, tokenizer, seed: int = 0, stream: str = "fallback",
                 avoid_repetition: float | None = None, fallback: str = "random", votes: int = 1,
                 readout: str = "b") -> None:
        import torch

        if fallback not in FALLBACKS:
            raise ValueError(f"fallback {fallback!r}: use one of {', '.join(FALLBACKS)}")
        if votes < 1:
            raise ValueError(f"votes {votes}: must be >= 1 (1: the greedy move)")
        if readout not in READOUTS:
            raise ValueError(f"readout {readout!r}: use one of {', '.join(READOUTS)}")
        self.model, self.tokenizer = model, tokenizer
        self.rng = random.Random(f"{seed}/{stream}")
        self.avoid_repetition, self.fallback, self.votes, self.readout = avoid_repetition, fallback, votes, readout
        self.generator = torch.Generator(device=model.wte.weight.device).manual_seed(
            random.Random(f"{seed}/{stream}/votes").getrandbits(63))

    @classmethod
    def load(cls, name_or_path: str | Path | None = None, device: str | None = None, threads: int | None = None,
             seed: int = 0, stream: str = "fallback", avoid_repetition: float | None = None,
             fallback: str = "random", votes: int = 1, readout: str = "b") -> ModelPlayer:
        """The checkpoint (default: the embedded model) on `device` (default: cuda when available, else cpu
        with `threads` torch threads)."""
        from rookworld.hub import load_model, resolve_default_model
        from rookworld.runtime import pick_device

        model, tokenizer = load_model(name_or_path or resolve_default_model(), device=pick_device(device, threads))
        return cls(model, tokenizer, seed, stream, avoid_repetition, fallback, votes, readout)

    def choose(self, boards: Sequence[chess.Board]) -> list[Choice]:
        """One choice per board (each with a legal move): by the readout, from one batched generation (greedy,
        or `votes` samples a board) or from the first-candidate scores."""
        if not boards:
            return []
        if self.readout == "first":
            scores = first_candidate_scores(self.model, self.tokenizer, boards, self._word_starts)
            completions = self.complete(boards) if self.avoid_repetition is not None else [""] * len(boards)
            return [choose_first(board, score, completion, self.avoid_repetition)
                    for board, score, completion in zip(boards, scores, completions)]
        return [choose_move(board, completion, self.rng, self.avoid_repetition, self.fallback)
                for board, completion in zip(boards, self.complete(boards))]

    @functools.cached_property
    def _word_starts(self):
        return word_start_ids(self.tokenizer)

    def complete(self, boards: Sequence[chess.Board]) -> list[str]:
        """The completion of each board's P prompt that the player acts on: greedy, or of `votes` samples the
        one whose legal `B:` move the most name."""
        from rookworld.generation import SamplingSettings, generate_groups
        from rookworld.sample import DEFAULT_MAX_NEW_TOKENS

        ids = self.tokenizer.encode_prompts([p_prompt(board.fen()) for board in boards])
        context = self.model.config.n_positions
        settings = [SamplingSettings(max_new_tokens=min(DEFAULT_MAX_NEW_TOKENS, context - len(p))) for p in ids]
        generation = generate_groups(self.model, ids, self.votes, settings, eos_id=self.tokenizer.eos_id,
                                     generator=self.generator, greedy=self.votes == 1)
        texts = self.tokenizer.decode_batch(generation.completions())
        groups = [texts[i:i + self.votes] for i in range(0, len(texts), self.votes)]
        return [group[vote(board, group)] for board, group in zip(boards, groups)]
