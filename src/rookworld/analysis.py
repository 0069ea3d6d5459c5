"""Stockfish's multipv analysis of a position: the ground truth of the P task."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import chess

from rookworld.arbiter import parse_fen
from rookworld.text import MAX_CANDIDATES

MATE_PAWNS = 1000.0  # a mate in n for the side to move is +(1000 - n/100) pawns, as in RookWorld data
EVAL_CLIP_PAWNS = 10.0  # mates (~±999.9) and won positions compare as ±10 pawns
# Lichess's win-probability curve: win% = 50 + 50 * (2 / (1 + exp(-0.00368208 * centipawns)) - 1),
# fitted on rated games; as an expected score in [0, 1] that is a logistic of 0.368208 per pawn.
EXPECTED_SCORE_PER_PAWN = 0.368208


def mate_to_pawns(moves_to_mate: int) -> float:
    """Pawn value of a forced mate: positive when the side to move mates (n > 0), negative when mated."""
    sign = 1.0 if moves_to_mate > 0 else -1.0
    return sign * round(MATE_PAWNS - abs(moves_to_mate) / 100.0, 2)


def clip_pawns(pawns: float) -> float:
    """An eval bounded to ±EVAL_CLIP_PAWNS: a mate and a won ending compare alike."""
    return min(EVAL_CLIP_PAWNS, max(-EVAL_CLIP_PAWNS, pawns))


def expected_score(pawns: float) -> float:
    """Expected game score (win 1, draw 0.5) of the side whose eval this is, from the clipped eval."""
    return 1.0 / (1.0 + math.exp(-EXPECTED_SCORE_PER_PAWN * clip_pawns(pawns)))


@dataclass(frozen=True)
class Analysis:
    """Top moves of a position, best first, with evals in pawns from the side to move's view.

    `limit` names the search limit that produced it (e.g. "depth=10"), so that analyses made with
    different limits never mix in a cache.
    """

    fen: str
    moves: tuple[str, ...]
    evals: tuple[float, ...]
    limit: str

    def __post_init__(self) -> None:
        if len(self.moves) != len(self.evals):
            raise ValueError(f"analysis of {self.fen!r}: {len(self.moves)} moves but {len(self.evals)} evals")

    def ranked(self) -> Analysis:
        """The same lines sorted by eval, best first; a stable sort, so ties keep their order. Data rows list
        their moves shuffled, and a node-limited search can list lines of an unfinished iteration out of order."""
        lines = sorted(zip(self.moves, self.evals), key=lambda line: -line[1])
        return Analysis(self.fen, tuple(m for m, _ in lines), tuple(e for _, e in lines), self.limit)

    @property
    def best(self) -> str | None:
        return self.moves[0] if self.moves else None

    @property
    def top5(self) -> tuple[str, ...]:
        """The moves a P answer's M: list names: the first five (every legal move when fewer)."""
        return self.moves[:MAX_CANDIDATES]

    def eval_of(self, move: str) -> float | None:
        try:
            return self.evals[self.moves.index(move)]
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {"fen": self.fen, "moves": list(self.moves), "evals": list(self.evals), "limit": self.limit}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Analysis:
        """Raises ValueError unless the fields have their types: a FEN string, move strings, finite evals."""
        fen, moves, evals = data.get("fen"), data.get("moves"), data.get("evals")
        if not isinstance(fen, str):
            raise ValueError(f"an analysis needs a FEN string, got {fen!r}")
        if not isinstance(moves, list | tuple) or not all(isinstance(m, str) for m in moves):
            raise ValueError(f"analysis of {fen!r}: moves must be a list of UCI strings, got {moves!r}")
        if not isinstance(evals, list | tuple) or not all(
                isinstance(e, int | float) and not isinstance(e, bool) and math.isfinite(e) for e in evals):
            raise ValueError(f"analysis of {fen!r}: evals must be a list of finite numbers (pawns), got {evals!r}")
        return cls(fen=fen, moves=tuple(moves), evals=tuple(float(e) for e in evals), limit=str(data.get("limit", "")))


def legal_analysis(analysis: Analysis) -> Analysis:
    """`analysis` itself if it is of a legal position and names distinct legal moves, some when any exist;
    ValueError (InvalidPromptError for the position) otherwise."""
    board = parse_fen(analysis.fen)
    illegal = [m for m in analysis.moves if chess.Move.from_uci(m) not in board.legal_moves]
    if illegal:
        raise ValueError(f"moves not legal in {analysis.fen!r}: {' '.join(illegal)}")
    if len(set(analysis.moves)) != len(analysis.moves):
        raise ValueError(f"moves named twice in the analysis of {analysis.fen!r}: {' '.join(analysis.moves)}")
    if not analysis.moves and any(board.legal_moves):
        raise ValueError(f"the analysis of {analysis.fen!r} names no move, but the position has legal moves")
    return analysis
