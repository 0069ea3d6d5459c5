"""Games as move lists, their plies (position, move, history), and games read from PGN files."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import chess
import chess.pgn

from rookworld.errors import UserError
from rookworld.text import MAX_HISTORY


@dataclass(frozen=True)
class Game:
    moves: tuple[str, ...]  # UCI, played from start_fen
    start_fen: str = chess.STARTING_FEN


@dataclass(frozen=True)
class Ply:
    """One move of a game: the position before it, the move, and the moves before it (at most 9, so
    that with the move itself an A prompt's history holds the last 10), and the game's id in the dataset
    (None for plies that belong to no recorded game, e.g. fresh random walks)."""

    fen: str
    move: str
    history: tuple[str, ...]
    index: int  # ply number in the game, from 0
    game: str | None = None


def plies(game: Game, game_id: str | None = None) -> Iterator[Ply]:
    board = chess.Board(game.start_fen)
    for index, move in enumerate(game.moves):
        yield Ply(board.fen(), move, game.moves[max(0, index - (MAX_HISTORY - 1)):index], index, game_id)
        board.push_uci(move)


def read_pgn_games(paths: Sequence[str | Path]) -> Iterator[Game]:
    """The mainlines of the standard-chess games in `paths`, in file order; games of other variants, with
    move errors or without moves are left out."""
    for path in paths:
        try:
            handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise UserError(f"cannot read PGN file {path}: {exc.strerror}") from None
        with handle:
            while (game := chess.pgn.read_game(handle)) is not None:
                start = game.board()
                if type(start) is not chess.Board or start.chess960 or game.errors:
                    continue
                moves = tuple(move.uci() for move in game.mainline_moves())
                if moves:
                    yield Game(moves, start.fen())
