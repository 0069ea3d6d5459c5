import math

import pytest

from rookworld.analysis import EVAL_CLIP_PAWNS, clip_pawns, expected_score, mate_to_pawns


def test_expected_score_is_lichess_win_curve():
    assert expected_score(0.0) == 0.5
    # Lichess: win% = 50 + 50 * (2 / (1 + exp(-0.00368208 * cp)) - 1); +100 cp is about 59.1%
    assert expected_score(1.0) == pytest.approx((50 + 50 * (2 / (1 + math.exp(-0.368208)) - 1)) / 100)
    assert expected_score(1.0) == pytest.approx(0.591, abs=1e-3)
    for pawns in (0.3, 1.0, 2.5, 7.0):
        assert expected_score(pawns) + expected_score(-pawns) == pytest.approx(1.0)
        assert expected_score(pawns) > expected_score(pawns / 2)


def test_mates_compare_as_the_clip():
    assert clip_pawns(mate_to_pawns(3)) == EVAL_CLIP_PAWNS and clip_pawns(mate_to_pawns(-2)) == -EVAL_CLIP_PAWNS
    assert expected_score(mate_to_pawns(1)) == expected_score(EVAL_CLIP_PAWNS) > 0.97
