"""The RookWorld text protocol: exact rendering, tolerant parsing, round trips on the real fixtures."""

import json
import time

import pytest
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from rookworld import text
from rookworld.analysis import mate_to_pawns
from rookworld.errors import InvalidPromptError

VAL_LINES = (FIXTURES / "rook_val_sample.txt").read_text().splitlines()
A_OPENINGS = json.loads((FIXTURES / "a_task_openings_sample.json").read_text())
A_GENERATIONS = json.loads((FIXTURES / "rookworld_lm_a_generations.json").read_text())
K4 = json.loads((FIXTURES / "rookworld_lm_completions_k4.json").read_text())["sample_results"]
START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"


@pytest.mark.parametrize(("pawns", "expected"), [
    (-2.3, "-2.3"), (0.0, "0.0"), (-0.0, "0.0"), (-0.004, "0.0"), (3.14159, "3.14"), (4, "4.0"),
    (mate_to_pawns(3), "999.97"), (mate_to_pawns(-12), "-999.88"),
])
def test_format_eval(pawns, expected):
    assert text.format_eval(pawns) == expected


def test_p_layout_is_exact():
    target = text.p_target(START, ["e2e4", "d2d4", "g1f3", "c2c4", "b1c3"], [0.3, 0.25, 0.2, 0.18, -0.04], "e2e4")
    line = text.p_prompt(START) + target
    assert text.p_prompt(START) == "P: " + START
    assert line == ("P: " + START + " " * (90 - len(START)) + "M: e2e4 d2d4 g1f3 c2c4 b1c3" + " " * 6
                    + "E: 0.3 0.25 0.2 0.18 -0.04" + " " * 17 + "B: e2e4")
    assert (line.index("M:"), line.index("E:"), line.index("B:")) == (93, 126, 169)
    narrow = text.p_prompt(START) + text.p_target(START, ["e2e4"], [0.3], "e2e4", fen_width=89)
    assert (narrow.index("M:"), narrow.index("E:"), narrow.index("B:")) == (92, 125, 168)


def test_every_validation_line_round_trips_in_its_column_variant():
    assert len(VAL_LINES) == 250
    for line in VAL_LINES:
        parsed = text.parse_p_line(line)
        assert parsed.errors == [], line
        assert parsed.fen_width == 89
        assert text.p_prompt(parsed.fen) + text.p_target(parsed.fen, parsed.moves, parsed.evals, parsed.best,
                                                         parsed.fen_width) == line


def test_wide_variant_parses_to_the_same_fields():
    for line in VAL_LINES[:20]:
        narrow = text.parse_p_line(line)
        wide_line = text.p_prompt(narrow.fen) + text.p_target(narrow.fen, narrow.moves, narrow.evals, narrow.best)
        wide = text.parse_p_line(wide_line)
        assert (wide.fen, wide.moves, wide.evals, wide.best, wide.fen_width) == (
            narrow.fen, narrow.moves, narrow.evals, narrow.best, 90)


def test_split_line_p_rows():
    for line in VAL_LINES:
        task, prompt, target = text.split_line(line + "\n")
        assert task == "P" and prompt + target == line
        assert prompt == "P: " + text.parse_p_line(line).fen
        assert text.parse_p_completion(target).errors == []


def test_split_line_a_rows_with_and_without_prefix():
    prompt = A_OPENINGS[0]["prompt"]
    target = A_OPENINGS[0]["expected_fen"] + "+0.001+0+0"
    assert text.split_line(prompt + target) == ("A", prompt, target)
    assert text.split_line(prompt[len("A: "):] + target) == ("A", prompt, target)


@pytest.mark.parametrize("line", ["", "hello world", "P: no fields at all", "Q: 8/8/8/8/8/8/8/8 w - - 0 1+a+b+c+d+e+f",
                                  "8/8/8 w - - 0 1+e2e4+e2e4+x+y+z+w"])
def test_split_line_rejects_other_text(line):
    with pytest.raises(ValueError):
        text.split_line(line)


def test_a_prompts_of_the_fixtures_round_trip():
    prompts = [row["prompt"] for row in A_OPENINGS + A_GENERATIONS]
    assert len(prompts) == 890
    for prompt in prompts:
        parsed = text.parse_a_prompt(prompt)
        assert text.a_prompt(parsed.fen, parsed.move, parsed.history) == prompt
        # the current move is appended when the caller passes only the earlier moves
        assert text.a_prompt(parsed.fen, parsed.move, parsed.history[:-1]) == prompt


def test_a_prompt_keeps_the_last_ten_moves():
    history = [f"{f}2{f}3" for f in "abcdefgh"] + ["a7a6", "b7b6", "c7c6", "d7d6"]
    prompt = text.a_prompt(START, "d7d6", history)
    assert prompt == f"A: {START}+d7d6+{' '.join(history[-10:])}+"
    assert text.parse_a_prompt(prompt).history == history[-10:]


@pytest.mark.parametrize("prompt", [
    "P: " + START, "A " + START + "+e2e4+e2e4+", "A: " + START + "+e2e4+e2e4", "A: " + START + "+e2e4+d2d4+",
    "A: +e2e4+e2e4+", "A: " + START + "++e2e4+", "A: " + START + "+e2e4++", "A: " + START + "+e2e4+e2e4+x+",
    "A: " + START + "+a1a2+" + " ".join(["a1a2"] * 11) + "+",
])
def test_parse_a_prompt_rejects_malformed_layouts(prompt):
    with pytest.raises(InvalidPromptError):
        text.parse_a_prompt(prompt)


def test_task_of():
    assert text.task_of("P: " + START) == "P"
    assert text.task_of(A_OPENINGS[0]["prompt"]) == "A"
    assert text.task_of(START) is None
    assert text.task_of(" P: " + START) is None


def test_real_completions_without_leading_padding_parse_cleanly():
    p_rows = [row for row in K4 if row["task_type"] == "P"]
    assert p_rows
    for row in p_rows:
        for completion in row["completions"]:
            assert completion.startswith("M:")
            parsed = text.parse_p_completion(completion)
            assert parsed.errors == [] and len(parsed.moves) == 5 and len(parsed.evals) == 5
            assert parsed.best is not None and parsed.fen is None


def test_parse_p_completion_any_run_of_whitespace():
    parsed = text.parse_p_completion("\t  M:e2e4    d2d4\tg1f3 E:0.3  0.2\n\n0.1 B:    e2e4   ")
    assert (parsed.moves, parsed.evals, parsed.best, parsed.errors) == (
        ["e2e4", "d2d4", "g1f3"], [0.3, 0.2, 0.1], "e2e4", [])


@pytest.mark.parametrize(("completion", "moves", "evals", "best", "errors"), [
    ("", [], [], None, ["missing M: field", "missing E: field", "missing B: field"]),
    ("M: e2e4 d2d4 E: 0.3", ["e2e4", "d2d4"], [0.3], None, ["missing B: field", "2 moves but 1 evals"]),
    ("E: 0.3 B: e2e4", [], [0.3], "e2e4", ["missing M: field"]),
    ("M: e2e4 E: 0.3 B:", ["e2e4"], [0.3], None, ["empty B: field"]),
    ("M: e2e4 E: 0.3 B: e2", ["e2e4"], [0.3], "e2", ["B: is not a UCI move: 'e2'"]),
    ("M: e2e4 E: 0.3 B: e2e4 B: d2d4", ["e2e4"], [0.3], "e2e4", ["extra text after the best move"]),
    ("M: a1a2 b1b2 c1c2 d1d2 e1e2 f1f2 E: 1 2 3 4 5 6 B: a1a2", ["a1a2", "b1b2", "c1c2", "d1d2", "e1e2"],
     [1.0, 2.0, 3.0, 4.0, 5.0], "a1a2", ["more than 5 moves", "more than 5 evals"]),
    ("M: e2e4 ♞♞ E: 0.3 nan B: e2e4", ["e2e4", "♞♞"], [0.3], "e2e4",
     ["M: tokens that are not UCI moves: '♞♞'", "E: tokens that are not finite numbers: 'nan'"]),
    ("E: 1 M: e2e4 B: e2e4", ["e2e4"], [], "e2e4",  # fields out of order
     ["unexpected text before the fields: 'E: 1'", "missing E: field"]),
    ("junk M: e2e4 E: ١٢ B: e2e4", ["e2e4"], [], "e2e4",
     ["unexpected text before the fields: 'junk'", "E: tokens that are not finite numbers: '١٢'"]),
])
def test_parse_p_completion_reports_what_is_malformed(completion, moves, evals, best, errors):
    parsed = text.parse_p_completion(completion)
    assert (parsed.moves, parsed.evals, parsed.best, parsed.errors) == (moves, evals, best, errors)


def test_an_unparseable_eval_does_not_shift_the_later_evals_onto_other_moves():
    # evals[i] is the eval of moves[i]: after a bad token the later evals have no known slot, so they are dropped
    parsed = text.parse_p_completion("M: e2e4 d2d4 g1f3 E: 0.3 +-0.2 0.1 B: e2e4")
    assert (parsed.moves, parsed.evals) == (["e2e4", "d2d4", "g1f3"], [0.3])
    assert parsed.errors == ["E: tokens that are not finite numbers: '+-0.2'"]


@pytest.mark.parametrize("completion, starts", [
    ("  M: e2e4 d2d4  E: 0.3 0.1  B: e2e4", (2, 16, 28)),
    ("M: e2e4 E: 0.3 B: e2e4", (0, 8, 15)),
    ("  M: e2e4  E: 0.3", None),             # truncated before B:
    ("  E: 0.3  M: e2e4  B: e2e4", None),    # out of order: M: is searched after E:, B: after M:
    ("", None),
])
def test_p_field_starts(completion, starts):
    assert text.p_field_starts(completion) == starts


def test_truncated_completions_keep_what_was_written():
    target = text.split_line(VAL_LINES[0])[2]
    full = text.parse_p_completion(target)
    for cut in range(len(target)):
        parsed = text.parse_p_completion(target[:cut])
        whole_moves = [m for m in parsed.moves if text.is_uci_shaped(m)]
        assert whole_moves == full.moves[:len(whole_moves)]
        assert len(parsed.evals) <= len(full.evals)
        assert parsed.errors


def test_parse_a_completion():
    for row in A_GENERATIONS:
        parsed = text.parse_a_completion(row["generated"])
        assert parsed.fen is not None and parsed.reward == "0.001"
        assert (parsed.terminated, parsed.truncated) == ("0", "0")
        nine_ranks = row["generated"].startswith("rnbqkbnr/pppppppp/8/8/3PP3/8/PPPPPP/RNBQKPNKPP/RNB2RK1 ")
        assert parsed.errors == (["not a FEN of 6 fields and 8 ranks: 'rnbqkbnr/pppppppp/8/'"] if nine_ranks else [])
    assert text.parse_a_completion(" " + START + " + 1.0 +1+ 0\n") == text.ParsedA(START, "1.0", "1", "0", [])


@pytest.mark.parametrize(("completion", "errors"), [
    (START + "+0.001+0", ["3 of 4 '+'-separated fields"]),
    (START, ["1 of 4 '+'-separated fields"]),
    ("", ["empty fen", "1 of 4 '+'-separated fields"]),
    (START + "+0.01+2+0", ["reward '0.01' is not one of 0.001, 1.0, 0.5, -1.0", "terminated '2' is not 0 or 1"]),
    (START + "+0.001+0+0+0.001", ["extra text after the truncated flag: '0.001'"]),
    ("8/8/8 w - - 0 1+0.001+0+0", ["not a FEN of 6 fields and 8 ranks: '8/8/8 w - - 0 1'"]),
])
def test_parse_a_completion_reports_what_is_malformed(completion, errors):
    assert text.parse_a_completion(completion).errors == errors


ADVERSARIAL = [
    "M:" * 50_000, "M: " + "e2e4 " * 20_000, "E: " + "1" * 100_000, "E: " + "9" * 400 + " " + "-" * 99_000,
    "+" * 100_000, " " * 100_000, "\u2003" * 50_000, "B:" + "a" * 100_000, "/" * 100_000,
    "8" * 100_000 + "+0.001+0+0", ("M: E: B: " * 11_000)[:100_000], "\x00\ud800\U0010ffff" * 30_000,
]


@pytest.mark.parametrize("completion", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_huge_adversarial_strings_parse_fast(completion):
    start = time.perf_counter()
    text.parse_p_completion(completion)
    text.parse_p_line("P: " + completion)
    text.parse_a_completion(completion)
    assert time.perf_counter() - start < 0.5  # linear-time parsing takes ~2 ms here; backtracking takes minutes


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("MEB: +-.0123456789abcdefgh/KQkqw\t\n♞é\u2003\x00")) | st.characters(),
               max_size=300))
def test_parsers_never_raise(completion):
    for parsed in (text.parse_p_completion(completion), text.parse_p_line(completion)):
        assert len(parsed.moves) <= 5 and len(parsed.evals) <= 5
        assert all(isinstance(e, float) for e in parsed.evals)
    text.parse_a_completion(completion)
