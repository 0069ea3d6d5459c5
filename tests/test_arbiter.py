"""The A-task arbiter against real RookWorld data and a hand-built position for each chess rule."""

import json
import random

import chess
import pytest

from rookworld.arbiter import Transition, a_target, transition, transition_for_prompt
from rookworld.errors import InvalidPromptError
from rookworld.text import a_prompt

START = chess.STARTING_FEN


def played(fen: str, moves: str) -> tuple[str, str, list[str]]:
    """(FEN before the last move, the last move, all moves) of `moves` played from `fen`."""
    board = chess.Board(fen)
    ucis = moves.split()
    for uci in ucis[:-1]:
        board.push_uci(uci)
    return board.fen(), ucis[-1], ucis


# --- real data ---------------------------------------------------------------------------------

def test_all_opening_fixtures(fixtures_dir):
    rows = json.loads((fixtures_dir / "a_task_openings_sample.json").read_text())
    assert len(rows) == 870
    for row in rows:
        truth = transition_for_prompt(row["prompt"])
        assert truth == Transition(row["expected_fen"], "0.001", False, False), row["prompt"]


def test_rookworld_lm_generations_13_of_20_exact(fixtures_dir):
    rows = json.loads((fixtures_dir / "rookworld_lm_a_generations.json").read_text())
    truths = [transition_for_prompt(row["prompt"]) for row in rows]
    assert [t.fen for t in truths] == [row["expected"] for row in rows]
    assert sum(a_target(t) == row["generated"] for t, row in zip(truths, rows)) == 13


# --- the rules, one position each --------------------------------------------------------------

def test_a_target():
    t = Transition(fen="rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", reward="0.001",
                   terminated=False, truncated=False)
    assert a_target(t) == "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"
    illegal = Transition(fen=START, reward="-1.0", terminated=False, truncated=True)
    assert a_target(illegal) == START + "+-1.0+0+1"


def test_first_move_of_the_game_has_no_en_passant_square():
    assert transition(START, "e2e4", ["e2e4"]) == Transition(
        "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "0.001", False, False)
    assert transition_for_prompt(a_prompt(START, "g1f3", ["g1f3"])) == Transition(
        "rnbqkbnr/pppppppp/8/8/8/5N2/PPPPPPPP/RNBQKB1R b KQkq - 1 1", "0.001", False, False)


@pytest.mark.parametrize("fen, move, expected", [
    ("8/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7e8q", "4Q3/6k1/8/7p/8/8/8/K7 b - - 0 60"),
    ("8/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7e8n", "4N3/6k1/8/7p/8/8/8/K7 b - - 0 60"),
    ("8/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7e8r", "4R3/6k1/8/7p/8/8/8/K7 b - - 0 60"),
    ("3r4/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7d8b", "3B4/6k1/8/7p/8/8/8/K7 b - - 0 60"),
    ("3r4/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7d8q", "3Q4/6k1/8/7p/8/8/8/K7 b - - 0 60"),
    ("k7/8/8/8/8/8/3p3P/4R1K1 b - - 0 50", "d2e1n", "k7/8/8/8/8/8/7P/4n1K1 w - - 0 51"),
])
def test_promotions(fen, move, expected):
    assert transition(fen, move) == Transition(expected, "0.001", False, False)


@pytest.mark.parametrize("fen, move, expected", [
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 5 20", "e1g1", "r3k2r/8/8/8/8/8/8/R4RK1 b kq - 6 20"),
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 5 20", "e1c1", "r3k2r/8/8/8/8/8/8/2KR3R b kq - 6 20"),
    ("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 5 20", "e8g8", "r4rk1/8/8/8/8/8/8/R3K2R w KQ - 6 21"),
    ("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 5 20", "e8c8", "2kr3r/8/8/8/8/8/8/R3K2R w KQ - 6 21"),
    # Rights lost: king move, rook move, rook captured on its home square.
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 5 20", "e1f1", "r3k2r/8/8/8/8/8/8/R4K1R b kq - 6 20"),
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 5 20", "h1h5", "r3k2r/8/8/7R/8/8/8/R3K3 b Qkq - 6 20"),
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 5 20", "a1a8", "R3k2r/8/8/8/8/8/8/4K2R b Kk - 0 20"),
    ("r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 5 20", "h8h1", "r3k3/8/8/8/8/8/8/R3K2r w Qq - 0 21"),
])
def test_castling_and_castling_rights(fen, move, expected):
    assert transition(fen, move) == Transition(expected, "0.001", False, False)


def test_castling_through_an_attacked_square_is_illegal():
    fen = "r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 20"
    assert transition(fen, "e1g1") == Transition(fen, "-1.0", False, True)
    assert transition(fen, "e1c1").reward == "0.001"


def test_en_passant_square_only_when_the_capture_is_legal():
    free = transition("r5k1/3p4/8/4P3/8/8/8/4K3 b - - 0 40", "d7d5")
    assert free.fen == "r5k1/8/8/3pP3/8/8/8/4K3 w - d6 0 41"
    pinned = transition("4r1k1/3p4/8/4P3/8/8/8/4K3 b - - 0 40", "d7d5")  # e5 is pinned to the king on e1
    assert pinned.fen == "4r1k1/8/8/3pP3/8/8/8/4K3 w - - 0 41"
    assert transition("4r1k1/8/8/3pP3/8/8/8/4K3 w - d6 0 41", "e5d6").reward == "-1.0"


def test_en_passant_capture():
    fen = "rnbqkbnr/ppp1pppp/8/3pP3/8/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 3"
    assert transition(fen, "e5d6") == Transition(
        "rnbqkbnr/ppp1pppp/3P4/8/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 3", "0.001", False, False)


def test_checkmate_rewards_the_mover():
    fools_mate = "rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2"
    assert transition(fools_mate, "d8h4") == Transition(
        "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3", "1.0", True, False)
    assert transition("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30", "a1a8") == Transition(
        "R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 30", "1.0", True, False)


def test_stalemate_is_a_draw():
    assert transition("7k/8/8/6Q1/8/8/8/6K1 w - - 0 50", "g5g6") == Transition(
        "7k/8/6Q1/8/8/8/8/6K1 b - - 1 50", "0.5", True, False)


def test_insufficient_material_is_a_draw():
    assert transition("8/8/2k5/8/8/3b4/4R3/4K3 b - - 0 50", "d3e2") == Transition(
        "8/8/2k5/8/8/8/4b3/4K3 w - - 0 51", "0.5", True, False)
    assert transition("8/8/2k5/8/8/3b4/4R3/4K3 b - - 0 50", "c6d5").reward == "0.001"
    assert transition("k7/8/8/8/8/8/3p4/4R1K1 b - - 0 50", "d2e1n") == Transition(  # K+N vs K
        "k7/8/8/8/8/8/8/4n1K1 w - - 0 51", "0.5", True, False)


def test_seventy_five_move_rule():
    assert transition("8/8/4k3/8/8/4K3/8/7R w - - 149 120", "h1h2") == Transition(
        "8/8/4k3/8/8/4K3/7R/8 b - - 150 120", "0.5", True, False)
    assert transition("8/8/4k3/8/8/4K3/8/7R w - - 148 120", "h1h2").reward == "0.001"
    # A mate on the 150th ply is a mate, not a draw.
    assert transition("6k1/5ppp/8/8/8/8/8/R5K1 w - - 149 80", "a1a8") == Transition(
        "R5k1/5ppp/8/8/8/8/8/6K1 b - - 150 80", "1.0", True, False)


@pytest.mark.parametrize("fen, move", [
    (START, "e2e5"),            # no such pawn move
    (START, "e7e5"),            # the opponent's pawn
    (START, "e1g1"),            # castling through own pieces
    (START, "0000"),            # the null move is no move
    ("8/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7e8"),   # a pawn must promote
    ("8/4P1k1/8/7p/8/8/8/K7 w - - 3 60", "e7e8k"),  # not to a king
    ("4r1k1/8/8/8/8/8/4B3/4K3 w - - 0 40", "e2d3"),  # a pinned bishop
    ("4k3/8/8/8/8/8/3r4/4K3 w - - 0 40", "e1e2"),    # into check
])
def test_illegal_move_leaves_the_fen_and_truncates(fen, move):
    assert transition(fen, move, [move]) == Transition(fen, "-1.0", False, True)


# --- fivefold repetition: what the history can decide ------------------------------------------

KNIGHT_DANCE = " ".join(["g1f3 g8f6 f3g1 f6g8"] * 4)  # the start position for the 5th time


def test_fivefold_repetition_with_the_whole_game():
    fen, move, history = played(START, KNIGHT_DANCE)
    assert fen == "rnbqkb1r/pppppppp/5n2/8/8/8/PPPPPPPP/RNBQKBNR b KQkq - 15 8"
    assert transition(fen, move, history) == Transition(
        "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 16 9", "0.5", True, False)
    assert transition(fen, move, history[1:]).reward == "0.001"  # only 4 occurrences visible


def test_a_prompt_history_cannot_show_a_fivefold_repetition():
    fen, move, history = played(START, KNIGHT_DANCE)
    truth = transition_for_prompt(a_prompt(fen, move, history[-10:]))
    assert (truth.reward, truth.terminated) == ("0.001", False)


def test_repetition_counting_stops_at_an_en_passant_chance():
    # After e2e4 black could take en passant, so that position differs from its later copies.
    before_e4 = "rnbqkbnr/pppp1ppp/8/8/3p4/8/PPPPPPPP/RNBQKBNR w KQkq - 0 3"
    dance = "g8f6 g1f3 f6g8 f3g1"
    fen, move, history = played(before_e4, "e2e4 " + " ".join([dance] * 5))
    assert transition(fen, move, history).reward == "0.5"  # positions 4, 8, 12, 16 and 20 plies after e4
    fen, move, history = played(before_e4, "e2e4 " + " ".join([dance] * 4))
    assert transition(fen, move, history).reward == "0.001"
    assert transition(fen, move, history[1:]).reward == "0.001"  # e2e4 unseen, but the pawns say it may be


def test_repetition_counting_needs_proof_that_a_castling_right_was_gone():
    shuffle = " ".join(["e1f1 e8d8 f1e1 d8e8"] * 4)
    fen, move, history = played("3k4/8/8/8/8/8/7R/4K3 w - - 0 40", "h2h1 d8e8 " + shuffle)
    assert transition(fen, move, history).reward == "0.5"  # the rook stood on h2 in a rebuilt position
    # Without those moves, Ke1-f1 may have cancelled a right: the first position is not counted.
    assert transition(fen, move, history[2:]).reward == "0.001"
    fen, move, history = played("3k4/8/8/8/8/8/7R/4K3 w - - 0 40", "h2h1 d8e8 " + shuffle + " e1f1 e8d8 f1e1 d8e8")
    assert transition(fen, move, history[2:]).reward == "0.5"


def test_a_move_before_the_reversible_tail_can_prove_a_castling_right_gone():
    # a7a6 ends the replay, but h2h1 before it shows that h1 held no rook then.
    shuffle = " ".join(["e1f1 d8e8 f1e1 e8d8"] * 4)
    fen, move, history = played("3k4/p7/8/8/8/8/7R/4K3 w - - 0 40", "h2h1 a7a6 " + shuffle)
    assert transition(fen, move, history).reward == "0.5"
    assert transition(fen, move, history[2:]).reward == "0.001"


def shuffling_game(rng: random.Random, fen: str, plies: int) -> list[chess.Move]:
    """A game that often moves back the piece moved two plies before, so positions repeat."""
    board, moves = chess.Board(fen), []
    while len(moves) < plies and not board.is_game_over():
        legal = list(board.legal_moves)
        back = chess.Move(moves[-2].to_square, moves[-2].from_square) if len(moves) >= 2 else None
        quiet = [m for m in legal if not board.is_capture(m) and board.piece_type_at(m.from_square) != chess.PAWN]
        roll = rng.random()
        move = back if back in legal and roll < 0.7 else rng.choice(quiet if quiet and roll < 0.95 else legal)
        moves.append(move)
        board.push(move)
    return moves


def test_fivefold_matches_python_chess_on_whole_games():
    rng = random.Random(7)
    starts = [START, "r3k2r/pppq1ppp/2n2n2/3pp3/3PP3/2N2N2/PPPQ1PPP/R3K2R w KQkq - 0 8",
              "4k2r/8/8/8/8/8/8/R3K3 w Qk - 0 30"]
    repetitions = 0
    for game in range(9):
        fen = starts[game % len(starts)]
        moves = shuffling_game(rng, fen, 60)
        board = chess.Board(fen)
        for i, move in enumerate(moves):
            before = board.fen()
            board.push(move)
            truth = transition(before, move.uci(), [m.uci() for m in moves[:i + 1]])
            assert truth.terminated == board.is_game_over(), (fen, moves[:i + 1])
            assert truth.fen == board.fen()
            repetitions += board.is_fivefold_repetition()
    assert repetitions >= 5  # the games did reach the rule


# --- malformed input ---------------------------------------------------------------------------

@pytest.mark.parametrize("fen", [
    "",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq -",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 extra",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR  w KQkq - 0 1",
    "rnbqkbnr/pppppppp/9/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP w KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNX w KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR x KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkqX - 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq e9 0 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - -1 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - a 1",
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 x",
    "8/8/8/8/8/8/8/8 w - - 0 1",                       # no kings
    "4k3/8/8/8/8/8/8/3KK3 w - - 0 1",                  # two white kings
    "P3k3/8/8/8/8/8/8/4K3 w - - 0 1",                  # a pawn on the back rank
    "4k3/8/8/8/8/8/8/4K2r b - - 0 1",                  # the side not to move is in check
    "4k3/8/8/8/8/8/8/4K3 w K - 0 1",                   # castling right without the rook
    "4k3/8/8/8/8/8/8/4K3 w - e6 0 1",                  # en-passant square without a pawn
])
def test_bad_fen_raises_invalid_prompt_error(fen):
    with pytest.raises(InvalidPromptError, match="FEN"):
        transition(fen, "e2e4")


@pytest.mark.parametrize("move", ["", "e2", "e2e9", "E2E4", "e2-e4", "Nf3", "e2e4 ", "a1a1", "e7e8x", "e2e4qq"])
def test_bad_uci_raises_invalid_prompt_error(move):
    with pytest.raises(InvalidPromptError, match="not a UCI move"):
        transition(START, move)


def test_bad_history_raises_invalid_prompt_error():
    with pytest.raises(InvalidPromptError, match="'zz'"):
        transition(START, "e2e4", ["zz", "e2e4"])
    with pytest.raises(InvalidPromptError, match="must end with the move"):
        transition(START, "e2e4", ["d2d4"])


@pytest.mark.parametrize("prompt", [
    "",
    "A: ",
    f"P: {START}",
    f"{START}+e2e4+e2e4+",
    f"A: {START}+e2e4+e2e4",
    f"A: {START}+e2e4++",
    f"A: {START}++e2e4+",
    "A: +e2e4+e2e4+",
    f"A: {START}+e2e4+e2e4+extra+",
    f"A: {START}+e2e4+d2d4+",
    f"A: {START}+e2e9+e2e9+",
    "A: not a fen+e2e4+e2e4+",
    "A: " + START.replace("8/8/8/8", "8/8/8") + "+e2e4+e2e4+",
    "A: " + START + "+e2e4+" + " ".join(["g1f3"] * 10 + ["e2e4"]) + "+",
])
def test_malformed_prompt_raises_invalid_prompt_error(prompt):
    with pytest.raises(InvalidPromptError):
        transition_for_prompt(prompt)


def test_openings_fixture_lines_are_the_checked_targets(fixtures_dir):
    """a_openings.txt (the second held-out distribution) is the JSON fixture's prompts with their targets."""
    rows = json.loads((fixtures_dir / "a_task_openings_sample.json").read_text(encoding="utf-8"))
    lines = (fixtures_dir / "a_openings.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(rows) == 870
    for row, line in zip(rows, lines):
        assert line.startswith(row["prompt"])
        assert line[len(row["prompt"]):].split("+")[0] == row["expected_fen"]
