"""Task cases: what kind of transition an A sample exercises (and how to find moves of a rare kind), and
what kind of position a P sample asks about.

The original RookWorld A data is almost all ordinary moves; RookWorld-LM fails on most rare cases, so
the generator adds them on purpose and every A sample's meta.case names its kind.
"""

from __future__ import annotations

from collections.abc import Sequence

import chess
import numpy as np

from rookworld.arbiter import Transition

# In priority order: a promotion that mates is a "checkmate", a castling on move 1 cannot happen, etc.
CASES = ("illegal", "checkmate", "stalemate", "insufficient_material", "draw", "promotion", "en_passant",
         "castling", "first_move", "normal")
RARE_CASES = CASES[:-1]
# Cases that a legal move of a given position may produce (found by `case_moves`).
MOVE_CASES = ("checkmate", "stalemate", "insufficient_material", "promotion", "en_passant", "castling")
# The opponent keeps at most this many pieces (king included) in positions scanned for stalemates and
# draws by insufficient material: with more, neither practically occurs, and checking costs a push.
_FEW_PIECES = 4


def classify_p(fen: str) -> str:
    """The case of a P position: "check" when the side to move is in check (the base model's best move is
    illegal in most of them), else "normal"."""
    return "check" if chess.Board(fen).is_check() else "normal"


def classify_a(fen: str, move: str, transition: Transition) -> str:
    """The case of an A sample: its outcome first (illegal, mate, draws), then the kind of move."""
    if transition.truncated:
        return "illegal"
    if transition.reward == "1.0":
        return "checkmate"
    if transition.reward == "0.5":
        after = chess.Board(transition.fen)
        if after.is_stalemate():
            return "stalemate"
        if after.is_insufficient_material():
            return "insufficient_material"
        return "draw"
    board = chess.Board(fen)
    played = chess.Move.from_uci(move)
    if played.promotion:
        return "promotion"
    if board.is_en_passant(played):
        return "en_passant"
    if board.is_castling(played):
        return "castling"
    if board.fullmove_number == 1:
        return "first_move"
    return "normal"


def case_moves(board: chess.Board, cases: Sequence[str] = MOVE_CASES) -> dict[str, list[chess.Move]]:
    """The legal moves of `board` that produce each of `cases` (a subset of MOVE_CASES; a move may appear
    under two, `classify_a` decides which one its sample counts as). Promotion, en passant and castling
    are cheap to find; the outcomes need a trial push per candidate move."""
    found: dict[str, list[chess.Move]] = {case: [] for case in MOVE_CASES}
    want = set(cases)
    want_mate = "checkmate" in want
    few_left = (bool(want & {"stalemate", "insufficient_material"})
                and chess.popcount(board.occupied_co[not board.turn]) <= _FEW_PIECES)
    for move in board.legal_moves:
        if move.promotion:
            found["promotion"].append(move)
        if "en_passant" in want and board.is_en_passant(move):
            found["en_passant"].append(move)
        if "castling" in want and board.is_castling(move):
            found["castling"].append(move)
        gives_check = want_mate and board.gives_check(move)
        if not (gives_check or few_left):
            continue
        board.push(move)
        if gives_check and board.is_checkmate():
            found["checkmate"].append(move)
        elif few_left and not board.is_check() and board.is_stalemate():
            found["stalemate"].append(move)
        elif few_left and board.is_insufficient_material():
            found["insufficient_material"].append(move)
        board.pop()
    return {case: found[case] for case in cases}


def mating_moves(board: chess.Board) -> set[str]:
    """The legal moves (UCI) of `board` that checkmate: a mate in one for the side to move when not empty."""
    return {move.uci() for move in case_moves(board, ("checkmate",))["checkmate"]}


def illegal_move(board: chess.Board, rng: np.random.Generator) -> chess.Move:
    """A well-formed UCI move that is illegal here: half the time (when there is one) a pseudo-legal move
    that leaves the king in check, otherwise a piece of either colour sent to a square it cannot reach."""
    into_check = [move for move in board.pseudo_legal_moves if not board.is_legal(move)]
    if into_check and rng.random() < 0.5:
        return into_check[int(rng.integers(len(into_check)))]
    occupied = list(chess.SquareSet(board.occupied))
    while True:
        from_square = occupied[int(rng.integers(len(occupied)))]
        to_square = int(rng.integers(64))
        move = chess.Move(from_square, to_square)
        if to_square != from_square and not board.is_legal(move):
            return move
