"""Fresh A samples made on the fly for supervised training (`rookworld sft --fresh-a`), python-chess only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import chess
import numpy as np

from rookworld import text
from rookworld.data.a_mix import AMixer
from rookworld.data.games import Ply
from rookworld.data.record import Sample
from rookworld.data.splits import sample_split
from rookworld.errors import UserError

FRESH_CHUNK = 256  # fresh A samples made at a time: enough for the rare-case shares to round well
FRESH_GAME_PLIES = 8  # random moves played on from each training position


def _next_position(sample: Sample) -> str | None:
    """The FEN an A sample's move leads to; None when the move was illegal or ended the game."""
    truth = text.parse_a_completion(sample.target)
    if truth.fen is None or truth.truncated != "0" or truth.terminated != "0":
        return None
    return truth.fen


def _random_continuation(sample: Sample, length: int, rng: np.random.Generator) -> list[Ply]:
    """Up to `length` (at least one) random legal moves played on from the position an A sample's move
    leads to (`_next_position`, not None), as the plies of a game (history carried over from the prompt)."""
    board = chess.Board(_next_position(sample))
    history = text.parse_a_prompt(sample.prompt).history
    plies = []
    for index in range(length):
        moves = list(board.legal_moves)
        if not moves or board.is_game_over():
            break
        move = moves[int(rng.integers(len(moves)))].uci()
        plies.append(Ply(board.fen(), move, tuple(history[-(text.MAX_HISTORY - 1):]), index))
        board.push_uci(move)
        history.append(move)
    return plies


class FreshASamples:
    """An endless stream of A samples made on the fly, python-chess only.

    Games are short random walks (FRESH_GAME_PLIES random legal moves) from the positions the training
    A samples lead to (real game positions), turned into samples by the data generator's `AMixer`, so
    that the rare cases (illegal moves, mates, promotions, ...) come in the same shares as in generated
    data. Samples of eval-split positions are dropped. Chunk k is a pure function of (seed, k), so the
    state is two integers. Games start only after moves that are legal and do not end the game, so each
    has a move to play.
    """

    def __init__(self, samples: Sequence[Sample], seed: int) -> None:
        self.base = [s for s in samples if s.task == "A" and _next_position(s) is not None]
        if not self.base:
            raise UserError("--fresh-a needs A samples in the training data whose move is legal and does not "
                            "end the game, to start fresh games from; the training data has none")
        self.seed = seed
        self.chunk_index = 0
        self.cursor = 0
        self._chunk: list[Sample] | None = None

    def _make_chunk(self, index: int) -> list[Sample]:
        rng = np.random.default_rng([self.seed, index])
        games: list[list[Ply]] = []
        while sum(len(game) for game in games) < FRESH_CHUNK:
            base = self.base[int(rng.integers(len(self.base)))]
            games.append(_random_continuation(base, FRESH_GAME_PLIES, rng))
        made = AMixer(rng, set()).build(games, FRESH_CHUNK)
        order = rng.permutation(len(made))  # AMixer lists the rare cases first
        return [made[int(i)] for i in order if sample_split(made[int(i)]) == "train"]  # no game id: by position

    def next(self) -> Sample:
        if self._chunk is None:
            self._chunk = self._make_chunk(self.chunk_index)
        while self.cursor >= len(self._chunk):
            self.chunk_index += 1
            self.cursor = 0
            self._chunk = self._make_chunk(self.chunk_index)
        self.cursor += 1
        return self._chunk[self.cursor - 1]

    def state_dict(self) -> dict[str, Any]:
        return {"chunk_index": self.chunk_index, "cursor": self.cursor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.chunk_index, self.cursor = int(state["chunk_index"]), int(state["cursor"])
        self._chunk = None
