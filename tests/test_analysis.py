import json
import math

import pytest

from rookworld.analysis import EVAL_CLIP_PAWNS, Analysis, clip_pawns, expected_score, legal_analysis, mate_to_pawns
from rookworld.data import rows

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
MATED = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"


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


@pytest.mark.parametrize(("data", "reason"), [
    ({"fen": 1, "moves": [], "evals": []}, "needs a FEN string"),
    ({"fen": None, "moves": ["e2e4"], "evals": [0.3]}, "needs a FEN string"),
    ({"fen": START, "moves": "e2e4", "evals": [0.3]}, "list of UCI strings"),
    ({"fen": START, "moves": ["e2e4"], "evals": [float("nan")]}, "finite numbers"),
    ({"fen": START, "moves": ["e2e4"], "evals": [float("inf")]}, "finite numbers"),
    ({"fen": START, "moves": ["e2e4"], "evals": ["0.3"]}, "finite numbers"),
    ({"fen": START, "moves": ["e2e4"], "evals": [True]}, "finite numbers"),
    ({"fen": START, "moves": ["e2e4", "d2d4"], "evals": [0.3]}, "2 moves but 1 evals"),
])
def test_an_analysis_of_the_wrong_types_is_refused(data, reason):
    with pytest.raises(ValueError, match=reason):
        Analysis.from_json(data)


def test_an_analysis_must_be_of_a_legal_position_and_name_distinct_legal_moves():
    good = Analysis(START, ("e2e4", "d2d4"), (0.3, 0.25), "depth=10")
    assert legal_analysis(good) is good
    assert legal_analysis(Analysis(MATED, (), (), "depth=10")).moves == ()  # mated: nothing to name
    for analysis, reason in [
        (Analysis("8/8/8/8/8/8/4P3/8 w - - 0 1", ("e2e4",), (0.3,), "x"), "no white king"),
        (Analysis(START, ("e2e5",), (0.3,), "x"), "moves not legal"),
        (Analysis(START, ("e2e4", "e2e4"), (0.3, 0.3), "x"), "named twice"),
        (Analysis(START, (), (), "x"), "names no move"),
    ]:
        with pytest.raises(ValueError, match=reason):
            legal_analysis(analysis)


def test_data_rows_of_impossible_positions_or_analyses_are_refused():
    with pytest.raises(ValueError, match="no black king"):  # a text P row: checked as a position, not as text
        rows.from_line("P: 8/8/8/8/8/8/4P3/4K3 w - - 0 1 M: e2e4 e2e3 E: 0.3 0.2 B: e2e4")
    with pytest.raises(ValueError, match="named twice"):
        rows.from_line(f"P: {START} M: e2e4 e2e4 E: 0.3 0.2 B: e2e4")
    record = {"task": "P", "prompt": f"P: {START}", "analysis": {"fen": "bad fen", "moves": [], "evals": []}}
    with pytest.raises(ValueError, match="6 fields"):
        rows.from_record(json.loads(json.dumps(record)))
