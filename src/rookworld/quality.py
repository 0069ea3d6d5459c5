"""Move quality as players and engine authors measure it: the loss of a played move against the
engine's best, in pawns (centipawn loss / 100) and in expected score, at one fixed engine limit.

The truth is Stockfish at `LABEL_LIMIT` (the P labels' limit): the best eval from a multipv search of
the position, the played move's eval from a search restricted to that move (same root, same limit),
both cached by the pool. A stored analysis made at the same limit is used as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rookworld.analysis import Analysis, clip_pawns, expected_score
from rookworld.arbiter import legal_move, parse_fen

if TYPE_CHECKING:
    from rookworld.stockfish import Limit, StockfishPool

LOSS_CAP_PAWNS = 10.0  # one move's loss is capped here; an illegal or missing move counts as the cap
# Centipawn-loss bands of a legal move (upper bounds in pawns, inclusive); an illegal move is a blunder.
BANDS: tuple[tuple[str, float], ...] = (("best", 0.0), ("excellent", 0.2), ("good", 0.5),
                                        ("inaccuracy", 1.0), ("mistake", 3.0), ("blunder", float("inf")))


@dataclass(frozen=True)
class MoveQuality:
    """How much a move gives away: `loss` in pawns in [0, LOSS_CAP_PAWNS], `score_loss` in expected
    score in [0, 1]. An illegal or missing move loses the cap and forfeits the game (its score loss is
    the whole expected score of the best move)."""

    legal: bool
    loss: float
    score_loss: float

    @property
    def band(self) -> str:
        if not self.legal:
            return "blunder"
        centipawns = round(self.loss, 2)  # evals are whole centipawns: 1.33 - 0.83 is 0.5, not 0.5000000000000001
        return next(name for name, upper in BANDS if centipawns <= upper)


def judge(best_eval: float, move_eval: float | None) -> MoveQuality:
    """The quality of a move whose eval is `move_eval` (None: illegal or missing) where the best move's
    eval is `best_eval`; both in pawns from the mover's view."""
    if move_eval is None:
        return MoveQuality(legal=False, loss=LOSS_CAP_PAWNS, score_loss=expected_score(best_eval))
    loss = min(LOSS_CAP_PAWNS, max(0.0, clip_pawns(best_eval) - clip_pawns(move_eval)))
    return MoveQuality(legal=True, loss=loss,
                       score_loss=max(0.0, expected_score(best_eval) - expected_score(move_eval)))


def judge_moves(pool: StockfishPool, moves: Sequence[tuple[str, str | None]], limit: Limit | None = None,
                analyses: Sequence[Analysis | None] | None = None) -> list[MoveQuality]:
    """The quality of each (FEN, UCI move or None) at `limit` (default LABEL_LIMIT), with two batched
    engine calls at most. `analyses[i]`, when given and made at `limit`, is position i's truth."""
    from rookworld.stockfish import LABEL_LIMIT

    limit = limit or LABEL_LIMIT
    stored = list(analyses) if analyses is not None else [None] * len(moves)
    if len(stored) != len(moves):
        raise ValueError(f"{len(moves)} moves but {len(stored)} analyses")
    truths: dict[str, Analysis] = {a.fen: a for a in stored if a is not None and a.limit == limit.key() and a.moves}
    truths_of = [truths.get(a.fen) if a is not None else None for a in stored]
    missing = list(dict.fromkeys(fen for (fen, _), truth in zip(moves, truths_of) if truth is None))
    found = dict(zip(missing, pool.analyse(missing, limit, multipv=1))) if missing else {}
    truths_of = [truth or found[fen] for (fen, _), truth in zip(moves, truths_of)]

    legal = [legal_move(parse_fen(fen), uci) for fen, uci in moves]
    requests = list(dict.fromkeys((fen, move.uci()) for (fen, _), move, truth in zip(moves, legal, truths_of)
                                  if move is not None and truth.eval_of(move.uci()) is None))
    searched = dict(zip(requests, pool.evaluate_moves(requests, limit))) if requests else {}
    out = []
    for (fen, _), move, truth in zip(moves, legal, truths_of):
        if not truth.moves:
            raise ValueError(f"no legal move to judge in {fen!r} (mate or stalemate)")
        best = truth.evals[0]
        if move is None:
            out.append(judge(best, None))
            continue
        uci = move.uci()
        value = truth.eval_of(uci)
        out.append(judge(best, value if value is not None else searched[fen, uci]))
    return out


def band_shares(qualities: Sequence[MoveQuality]) -> dict[str, float]:
    """Share of moves in each band (all bands named, in order, summing to 1)."""
    counts = dict.fromkeys((name for name, _ in BANDS), 0)
    for quality in qualities:
        counts[quality.band] += 1
    total = max(1, len(qualities))
    return {name: count / total for name, count in counts.items()}
