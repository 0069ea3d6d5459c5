"""Move quality against the real engine: losses, expected score, bands, illegal moves."""

import pytest

from rookworld.analysis import Analysis, expected_score
from rookworld.quality import LOSS_CAP_PAWNS, band_shares, judge, judge_moves
from rookworld.stockfish import Limit, StockfishPool

MATE_IN_ONE = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30"  # a1a8#; anything else is about equal
HANGING_QUEEN = "rnb1kbnr/pppp1ppp/8/4p3/4P2q/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"  # f3h4 wins the queen
FAST = Limit(depth=8)


def test_judge_on_constructed_evals():
    assert judge(1.0, 1.0).loss == 0.0 and judge(1.0, 1.0).band == "best"
    assert judge(1.0, 1.5).loss == 0.0  # a search noise gain is no loss
    q = judge(0.5, -0.5)
    assert q.loss == pytest.approx(1.0) and q.band == "inaccuracy"
    assert q.score_loss == pytest.approx(expected_score(0.5) - expected_score(-0.5))
    assert judge(999.9, 0.0).loss == LOSS_CAP_PAWNS and judge(999.9, 0.0).band == "blunder"
    illegal = judge(2.0, None)
    assert not illegal.legal and illegal.loss == LOSS_CAP_PAWNS and illegal.band == "blunder"
    assert illegal.score_loss == pytest.approx(expected_score(2.0))  # a forfeit: the whole expected score
    assert [judge(0.0, -x).band for x in (0.1, 0.4, 0.8, 2.0, 5.0)] == \
        ["excellent", "good", "inaccuracy", "mistake", "blunder"]
    # a loss of exactly a band's bound is in that band, whatever the float subtraction leaves (1.33 - 0.83)
    for cents, band in [(20, "excellent"), (50, "good"), (100, "inaccuracy"), (300, "mistake")]:
        assert {judge((move + cents) / 100, move / 100).band for move in range(-400, 400)} == {band}
    shares = band_shares([judge(0, 0), judge(0, -5), judge(0, None), judge(0, -0.1)])
    assert shares == {"best": 0.25, "excellent": 0.25, "good": 0.0, "inaccuracy": 0.0, "mistake": 0.0,
                      "blunder": 0.5}


@pytest.mark.stockfish
def test_judge_moves_with_the_engine():
    with StockfishPool(processes=1) as pool:
        found = judge_moves(pool, [(MATE_IN_ONE, "a1a8"), (MATE_IN_ONE, "a1a2"), (MATE_IN_ONE, "e2e4"),
                                   (MATE_IN_ONE, None), (HANGING_QUEEN, "f3h4"), (HANGING_QUEEN, "a2a3")], FAST)
        mate, quiet, impossible, missing, win, slack = found
        assert mate.loss == 0.0 and mate.band == "best"
        assert quiet.legal and quiet.loss > 3.0  # still a rook up, but the mate is gone
        assert quiet.band == "blunder"  # missing a mate in one
        assert not impossible.legal and not missing.legal and impossible == missing
        assert win.loss == pytest.approx(0.0, abs=0.3) and slack.loss > 5.0  # leaves the queen en prise
        assert slack.score_loss > 0.3 > win.score_loss
        # a stored analysis at the same limit is the truth itself; one at another limit is ignored
        stored = Analysis(fen=MATE_IN_ONE, moves=("a1a2",), evals=(3.0,), limit=FAST.key())
        other = Analysis(fen=MATE_IN_ONE, moves=("a1a2",), evals=(3.0,), limit="depth=2")
        assert judge_moves(pool, [(MATE_IN_ONE, "a1a2")], FAST, [stored])[0].loss == 0.0
        assert judge_moves(pool, [(MATE_IN_ONE, "a1a2")], FAST, [other])[0].band == "blunder"
