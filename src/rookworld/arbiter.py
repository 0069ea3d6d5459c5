"""The A task's ground truth: what python-chess says a move does to a position. Pure, no I/O.

What a prompt (`FEN + move + the last <= 10 moves`) decides
-----------------------------------------------------------
Every rule but one is a function of the FEN and the move alone: legality, the new FEN (castling
rights, en-passant square, clocks), mate, stalemate, insufficient material and the 75-move rule (the
FEN carries the halfmove clock). The exception is fivefold repetition, which depends on the positions
before the FEN. A position can only recur after >= 4 plies, and only across reversible plies (no
pawn move, capture, loss of castling rights or en-passant chance), so five occurrences need a
halfmove clock >= 16 after the move, and the 16 moves up to it (the move included) to be known. Hence:

- halfmove clock after the move < 16 (every opening position): "no fivefold repetition" is exact;
- otherwise a 10-move history can show at most 3 occurrences, so the prompt cannot decide it. The
  arbiter then says "not a repetition"; if the game did repeat, the original generator, which held
  the whole game, said draw (0.5, terminated).

Given more moves (e.g. the whole game), `transition` undoes the reversible tail of the history from
the FEN and lets python-chess count repetitions on the rebuilt move stack. That count is never too
high. It is too low only when the repetitions began before the given moves, or at a rebuilt position
that cannot be proven to have had the FEN's castling rights (a king or rook leaves its home square
with no earlier sign that the right was already gone) or no en-passant chance (its previous move is
not given and a pawn may have just stepped two squares): that position and those before it are not
counted. On whole games it agrees with python-chess (see tests/test_arbiter.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import chess

from rookworld.errors import InvalidPromptError
from rookworld.text import parse_a_prompt

LEGAL = "0.001"
WIN = "1.0"
DRAW = "0.5"
ILLEGAL = "-1.0"

# Fewest reversible plies that hold five occurrences of one position (each return takes >= 4 plies).
_FIVEFOLD_PLIES = 16

# Castling right (by its rook's home square) -> (colour, king's home square).
_CASTLING_HOMES = {
    chess.H1: (chess.WHITE, chess.E1), chess.A1: (chess.WHITE, chess.E1),
    chess.H8: (chess.BLACK, chess.E8), chess.A8: (chess.BLACK, chess.E8),
}
_STATUS_NAMES = {getattr(chess, name): name.removeprefix("STATUS_").lower().replace("_", " ")
                 for name in dir(chess) if name.startswith("STATUS_") and name != "STATUS_VALID"}


@dataclass(frozen=True)
class Transition:
    """The environment's answer: reward in {"0.001", "1.0", "0.5", "-1.0"}; illegal: FEN unchanged, +0+1."""

    fen: str
    reward: str
    terminated: bool
    truncated: bool


def a_target(t: Transition) -> str:
    """The A task's target text for a transition: `new_FEN+reward+terminated+truncated`."""
    return f"{t.fen}+{t.reward}+{int(t.terminated)}+{int(t.truncated)}"


def transition(fen: str, move: str, history: Sequence[str] = ()) -> Transition:
    """The exact A-task target for `move` played in `fen`.

    `history`: the moves that led to `fen`, oldest first, ending with `move` (the prompt holds the
    last <= 10); it only matters for fivefold repetition (see the module docstring). A move is legal
    when python-chess's `Board.is_legal` says so. Raises InvalidPromptError for a malformed FEN, a
    position python-chess rejects, a malformed UCI move, or a history that does not end with `move`.
    """
    board = parse_fen(fen)
    played = _parse_uci(move, "move")
    earlier = [_parse_uci(uci, "history move") for uci in history]
    if earlier and earlier[-1] != played:
        raise InvalidPromptError(f"history {' '.join(history)!r} must end with the move {move!r}")
    if not board.is_legal(played):
        return Transition(fen=fen, reward=ILLEGAL, terminated=False, truncated=True)

    after = board.copy(stack=False)
    after.push(played)
    outcome = after.outcome(claim_draw=False)
    if outcome is None and _is_fivefold_after(board, played, earlier[:-1]):
        outcome = chess.Outcome(chess.Termination.FIVEFOLD_REPETITION, None)
    # Only checkmate has a winner in standard chess, and only the side that just moved can mate.
    if outcome is None:
        reward = LEGAL
    elif outcome.termination == chess.Termination.CHECKMATE:
        reward = WIN
    else:
        reward = DRAW
    return Transition(fen=after.fen(), reward=reward, terminated=outcome is not None, truncated=False)


def transition_for_prompt(prompt: str) -> Transition:
    """The exact target of an A prompt `A: fen+move+history+`; InvalidPromptError if malformed."""
    parsed = parse_a_prompt(prompt)
    return transition(parsed.fen, parsed.move, parsed.history)


def parse_fen(fen: str) -> chess.Board:
    """A board from a complete six-field FEN of a valid position; InvalidPromptError otherwise."""
    fields = fen.split(" ")
    if len(fields) != 6 or not all(fields):
        raise InvalidPromptError(f"FEN {fen!r} must have 6 fields separated by single spaces "
                                 "(placement, side to move, castling, en passant, halfmove, fullmove)")
    try:
        board = chess.Board(fen)
    except ValueError as error:
        raise InvalidPromptError(f"FEN {fen!r} is malformed: {error}") from None
    status = board.status()
    if status != chess.STATUS_VALID:
        problems = ", ".join(name for flag, name in _STATUS_NAMES.items() if status & flag)
        raise InvalidPromptError(f"FEN {fen!r} is not a legal chess position: {problems}")
    return board


def _parse_uci(uci: str, what: str) -> chess.Move:
    try:
        return chess.Move.from_uci(uci)
    except ValueError:
        raise InvalidPromptError(f"{what} {uci!r} is not a UCI move (like e2e4, e7e8q or 0000)") from None


def _is_fivefold_after(before: chess.Board, played: chess.Move, earlier: Sequence[chess.Move]) -> bool:
    """Whether `played` makes a fivefold repetition, as far as the moves `earlier` (oldest first,
    ending at `before`) can show: rebuild the positions they passed through, then ask python-chess."""
    reversible = min(before.halfmove_clock, len(earlier))
    if reversible + 1 < _FIVEFOLD_PLIES:
        return False
    tail = list(earlier[len(earlier) - reversible:])
    positions = _undo_reversible(before, tail)
    tail = tail[len(tail) - (len(positions) - 1):]  # positions[i] is the board tail[i] was played on
    start = _first_known_castling_rights(positions, earlier)
    board = positions[start].copy(stack=False)
    if start == 0:
        known, board.ep_square = _first_en_passant(board, earlier, len(tail))
        if not known:  # it may have had an en-passant chance that made it unrepeatable: leave it out
            start = 1
            board = positions[1].copy(stack=False)
    for move in tail[start:]:
        board.push(move)
    board.push(played)
    return board.is_fivefold_repetition()


def _undo_reversible(before: chess.Board, tail: Sequence[chess.Move]) -> list[chess.Board]:
    """Boards before each move of `tail` (oldest first), then `before`, as far back as each move can be
    undone exactly: a quiet non-pawn move, legal where it was played. Castling rights stay those of
    `before` (checked afterwards); a move that does not fit the position ends the rebuild."""
    positions = [before]  # newest first while rebuilding
    for move in reversed(tail):
        later = positions[-1]
        piece = later.piece_at(move.to_square)
        if piece is None or piece.color == later.turn or later.piece_at(move.from_square) is not None:
            break
        previous = later.copy(stack=False)
        previous.remove_piece_at(move.to_square)
        previous.set_piece_at(move.from_square, piece)
        previous.turn = piece.color
        previous.ep_square = None
        previous.halfmove_clock = later.halfmove_clock - 1
        previous.fullmove_number = later.fullmove_number - (piece.color == chess.BLACK)
        if not previous.is_legal(move):
            break
        previous.push(move)
        fits = previous == later  # not so for e.g. castling, a pawn move, or one cancelling a right of `before`
        previous.pop()
        if not fits:
            break
        positions.append(previous)
    return positions[::-1]


def _first_known_castling_rights(positions: Sequence[chess.Board], earlier: Sequence[chess.Move]) -> int:
    """Index of the earliest rebuilt position from which on no move can have cancelled a castling right.

    The rebuilt boards carry the FEN's rights, but an earlier one may have had more. A right is surely
    gone once its king or rook is off its home square in a rebuilt position, or once any move of the
    history has touched either square (that piece moved away, or the square did not hold it)."""
    offset = len(earlier) - (len(positions) - 1)  # earlier[offset + i] was played on positions[i]
    gone_from = {}
    for rook, (colour, king) in _CASTLING_HOMES.items():
        off_home = (i for i, board in enumerate(positions)
                    if board.piece_at(king) != chess.Piece(chess.KING, colour)
                    or board.piece_at(rook) != chess.Piece(chess.ROOK, colour))
        touched = (k + 1 - offset for k, move in enumerate(earlier)
                   if {move.from_square, move.to_square} & {king, rook})
        gone_from[rook] = min(next(off_home, len(positions)), next(touched, len(positions)))
    for i in range(len(positions) - 2, -1, -1):
        moved_from = earlier[offset + i].from_square
        for rook, (colour, king) in _CASTLING_HOMES.items():
            could_cancel = moved_from in (rook, king) and positions[i].piece_at(moved_from).color == colour
            if could_cancel and gone_from[rook] > i:
                return i + 1
    return 0


def _first_en_passant(board: chess.Board, earlier: Sequence[chess.Move], rebuilt: int) -> tuple[bool, int | None]:
    """(known, square): the en-passant square of the earliest rebuilt `board`, `rebuilt` moves before the
    end of `earlier`. Only the move before it can have made one: a double pawn step, read from the
    history when there; else it is known only if the clock or the pawns rule a double step out."""
    if board.halfmove_clock > 0:
        return True, None
    if len(earlier) > rebuilt:
        previous = earlier[len(earlier) - rebuilt - 1]
        pawn = board.piece_at(previous.to_square)
        double_step = (pawn is not None and pawn.piece_type == chess.PAWN and pawn.color != board.turn
                       and abs(previous.to_square - previous.from_square) == 16)
        return True, (previous.from_square + previous.to_square) // 2 if double_step else None
    skipped_rank = 2 if board.turn == chess.BLACK else 5
    for file in range(8):
        candidate = board.copy(stack=False)
        candidate.ep_square = chess.square(file, skipped_rank)
        if candidate.status() == chess.STATUS_VALID and candidate.has_legal_en_passant():
            return False, None
    return True, None


def legal_move(board: chess.Board, uci: str | None) -> chess.Move | None:
    """The legal move `uci` names on `board` (king-takes-rook castling such as e1h1 included, as python-chess
    reads it); None for a missing, non-UCI or illegal move, and for the null move 0000."""
    if not uci:
        return None
    try:
        move = board.parse_uci(uci)
    except ValueError:  # not UCI, or not legal here
        return None
    return move or None  # the null move 0000 parses, but is no move
