"""Random sparse positions built to hold a rare A case that games seldom reach.

Each recipe places the two kings and a few pieces at random (a fixed piece where the case needs one,
e.g. a pawn on the 7th rank for promotions), keeps only valid positions, and returns the legal moves
that produce the case. Positions get a mid-game move number and a history of only the move itself
(en passant: the double step that allows it, then the capture).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import chess
import numpy as np

from rookworld.data.cases import case_moves

# Piece types a recipe may add at random (repeats weight the draw).
_ATTACKERS = "QRRBN"
_DEFENDERS = "PPPNBR"


def _sparse_board(rng: np.random.Generator, turn: chess.Color, fixed: dict[chess.Square, chess.Piece],
                  extra: Sequence[chess.Piece]) -> chess.Board | None:
    """`extra`, and the kings that `fixed` lacks, on random free squares (pawns off the back ranks) beside
    `fixed`; None when the result is not a valid position (e.g. the side not to move is in check) or the
    game is already over."""
    board = chess.Board(None)
    for square, piece in fixed.items():
        board.set_piece_at(square, piece)
    kings = [chess.Piece(chess.KING, color) for color in chess.COLORS if not board.pieces(chess.KING, color)]
    for piece in [*kings, *extra]:
        free = [s for s in chess.SQUARES if board.piece_at(s) is None
                and not (piece.piece_type == chess.PAWN and chess.square_rank(s) in (0, 7))]
        board.set_piece_at(free[int(rng.integers(len(free)))], piece)
    board.turn = turn
    board.fullmove_number = int(rng.integers(30, 90))
    return board if board.is_valid() and not board.is_game_over() else None


def _pieces(rng: np.random.Generator, symbols: str, low: int, high: int, color: chess.Color) -> list[chess.Piece]:
    """Between `low` and `high` pieces of `color`, their types drawn from `symbols`."""
    count = int(rng.integers(low, high + 1))
    return [chess.Piece(chess.Piece.from_symbol(symbols[int(rng.integers(len(symbols)))]).piece_type, color)
            for _ in range(count)]


def _mating_net(rng: np.random.Generator, turn: chess.Color) -> chess.Board | None:
    """Heavy pieces against a nearly bare king on the edge, the other king two squares from it: mates and
    stalemates in one are common there."""
    edge = [s for s in chess.SQUARES if chess.square_rank(s) in (0, 7) or chess.square_file(s) in (0, 7)]
    lone = edge[int(rng.integers(len(edge)))]
    near = [s for s in chess.SQUARES if chess.square_distance(s, lone) == 2]
    kings = {lone: chess.Piece(chess.KING, not turn), near[int(rng.integers(len(near)))]: chess.Piece(chess.KING, turn)}
    return _sparse_board(rng, turn, kings, _pieces(rng, _ATTACKERS, 1, 2, turn) + _pieces(rng, "P", 0, 1, not turn))


def _last_victim(rng: np.random.Generator, turn: chess.Color) -> chess.Board | None:
    """King (and maybe one minor piece) against king and one piece: capturing it may leave a dead draw."""
    return _sparse_board(rng, turn, {}, _pieces(rng, "BN", 0, 1, turn) + _pieces(rng, _DEFENDERS, 1, 1, not turn))


def _promoting_pawn(rng: np.random.Generator, turn: chess.Color) -> chess.Board | None:
    rank = 6 if turn == chess.WHITE else 1
    pawn = {chess.square(int(rng.integers(8)), rank): chess.Piece(chess.PAWN, turn)}
    extra = _pieces(rng, _ATTACKERS, 0, 1, turn) + _pieces(rng, _DEFENDERS, 0, 2, not turn)
    return _sparse_board(rng, turn, pawn, extra)


RECIPES: dict[str, Callable[[np.random.Generator, chess.Color], chess.Board | None]] = {
    "checkmate": _mating_net,
    "stalemate": _mating_net,
    "insufficient_material": _last_victim,
    "promotion": _promoting_pawn,
}


def en_passant_position(rng: np.random.Generator, turn: chess.Color) -> tuple[chess.Board, chess.Move] | None:
    """A position right after the opponent's double pawn step beside one of `turn`'s pawns, and that step."""
    file = int(rng.integers(8))
    side = int(rng.choice([-1, 1])) if 0 < file < 7 else (1 if file == 0 else -1)
    own_rank, start_rank = (4, 6) if turn == chess.WHITE else (3, 1)
    step_to = chess.square(file + side, own_rank)
    step_from = chess.square(file + side, start_rank)
    fixed = {chess.square(file, own_rank): chess.Piece(chess.PAWN, turn), step_from: chess.Piece(chess.PAWN, not turn)}
    middle = chess.square(file + side, (own_rank + start_rank) // 2)
    extra = _pieces(rng, _ATTACKERS, 0, 1, turn) + _pieces(rng, _DEFENDERS, 0, 2, not turn)
    board = _sparse_board(rng, not turn, fixed, extra)
    step = chess.Move(step_from, step_to)
    if board is None or board.piece_at(middle) or board.piece_at(step_to) or not board.is_legal(step):
        return None
    board.push(step)
    return board, step


def synthetic_case(case: str, rng: np.random.Generator) -> tuple[chess.Board, chess.Move, tuple[str, ...]] | None:
    """One attempt at a random position with a legal move of `case`: (board, move, history before the
    move); None when the attempt found none (callers retry)."""
    turn = bool(rng.integers(2))
    history: tuple[str, ...] = ()
    if case == "en_passant":
        made = en_passant_position(rng, turn)
        if made is None:
            return None
        board, step = made
        history = (step.uci(),)
    elif case in RECIPES:
        board = RECIPES[case](rng, turn)
        if board is None:
            return None
    else:
        raise ValueError(f"no synthetic recipe for case {case!r}")
    moves = case_moves(board, (case,))[case]
    if not moves:
        return None
    return board, moves[int(rng.integers(len(moves)))], history
