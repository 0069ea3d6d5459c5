"""Facts about a position read straight from its FEN string: its identity, move number and game phase.

Pure string functions (no python-chess board), because they run for every sample that is loaded.
"""

from __future__ import annotations

from typing import Literal

Phase = Literal["opening", "middlegame", "endgame"]
PHASES: tuple[Phase, ...] = ("opening", "middlegame", "endgame")

# Non-pawn material of both sides together at or below which a position counts as an endgame: e.g.
# rook + rook + bishop each (26), or queen alone each (18); the initial position has 62.
ENDGAME_MATERIAL = 26
# Full moves up to which a position that is not an endgame counts as the opening.
OPENING_LAST_MOVE = 10

_PIECE_VALUES = {"n": 3, "b": 3, "r": 5, "q": 9, "N": 3, "B": 3, "R": 5, "Q": 9}


def position_key(fen: str) -> str:
    """The position without its move counters (board, side to move, castling, en passant).

    Two FENs with the same key are the same position for the purpose of splits and de-duplication.
    """
    return " ".join(fen.split()[:4])


def move_number(fen: str) -> int:
    """The FEN's full-move number (1 when the field is missing or malformed)."""
    fields = fen.split()
    try:
        return max(1, int(fields[5]))
    except (IndexError, ValueError):
        return 1


def non_pawn_material(fen: str) -> int:
    board = fen.split(" ", 1)[0]
    return sum(board.count(piece) * value for piece, value in _PIECE_VALUES.items())


def game_phase(fen: str) -> Phase:
    """Endgame when the non-pawn material of both sides is <= 26 (N = B = 3, R = 5, Q = 9);
    otherwise the opening up to full move 10; otherwise the middlegame."""
    if non_pawn_material(fen) <= ENDGAME_MATERIAL:
        return "endgame"
    if move_number(fen) <= OPENING_LAST_MOVE:
        return "opening"
    return "middlegame"


def position_meta(fen: str) -> dict[str, object]:
    """The meta fields that every sample carries, derived from the position it asks about."""
    return {"phase": game_phase(fen), "move_number": move_number(fen)}
