"""`rookworld uci`: the model as a UCI engine, driven by python-chess's own UCI client."""

from __future__ import annotations

import io
import random
import sys

import chess
import chess.engine
import pytest

from rookworld.player import Choice, ModelPlayer, choose_move, repeats
from rookworld.uci import describe, parse_position, serve

START = chess.Board()


def test_the_engine_plays_the_model_then_its_own_list_then_a_legal_move_and_says_which():
    rng = random.Random(0)
    own = choose_move(START, "M: e2e4 d2d4 E: 0.3 0.2 B: e2e4", rng, fallback="listed")
    assert own.move == chess.Move.from_uci("e2e4") and describe(START, own) is None
    listed = "M: e2e5 g1f3 d2d4 b1c3 E: 0.9 0.1 0.3 0.3 B: e2e5"  # e2e5 is illegal; d2d4 ties b1c3 and comes first
    replaced = choose_move(START, listed, rng, fallback="listed")
    assert not replaced.own and replaced.move == chess.Move.from_uci("d2d4")
    note = describe(START, replaced)
    assert "'e2e5' is not a legal move" in note and "played d2d4, the best legal move of the model's M:/E:" in note
    garbage = choose_move(START, "nonsense", rng, fallback="listed")
    assert not garbage.own and garbage.move in START.legal_moves
    note = describe(START, garbage)
    assert "no B: move and no M: move is legal" in note and f"random legal move {garbage.move.uci()}" in note
    randomly = Choice(chess.Move.from_uci("a2a3"), False, listed)  # what a random-fallback player plays
    assert describe(START, randomly).endswith("'e2e5' is not a legal move; played the random legal move a2a3")
    avoiding = Choice(chess.Move.from_uci("d2d4"), True, listed, avoided=chess.Move.from_uci("g1f3"))
    assert describe(START, avoiding).startswith("B: g1f3 repeats a position; played d2d4")


def test_position_commands():
    assert parse_position(["startpos"]) == START
    board = parse_position(["startpos", "moves", "e2e4", "e7e5", "g1f3"])
    assert board.fen() == "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq - 1 2"
    fen = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 30"
    assert parse_position(["fen", *fen.split(), "moves", "a1a8"]).is_checkmate()
    for bad in ([], ["fen"], ["middlegame"], ["startpos", "moves", "e2e5"]):
        with pytest.raises(ValueError):
            parse_position(bad)


def test_serve_answers_every_command_with_the_embedded_model():
    player = ModelPlayer.load(threads=1, fallback="listed")
    commands = ["uci", "isready", "setoption name Hash value 16", "ucinewgame", "position startpos moves e2e4",
                "go wtime 1000 btime 1000", "position nonsense", "stop",
                "position fen 6k1/5ppp/8/8/8/8/5PPP/3r2K1 w - - 0 30", "go depth 5", "quit", "isready"]
    out = io.StringIO()
    serve(player, "test", io.StringIO("\n".join(commands) + "\n"), out)
    lines = out.getvalue().splitlines()
    assert lines[:4] == ["id name rookworld (test)", "id author rookworld", "uciok", "readyok"]
    first = next(line for line in lines if line.startswith("bestmove"))
    assert chess.Move.from_uci(first.split()[1]) in parse_position(["startpos", "moves", "e2e4"]).legal_moves
    assert any(line.startswith("info string ignored position") for line in lines)
    assert lines[-1] == "bestmove 0000"  # white is mated there; and nothing is answered after quit


# the third game of a match of the embedded model against itself (`rookworld play --opponent model --seed 0`):
# white's greedy b4c3 would bring back the position after the 17th ply
REPEATING = "b2b3 d7d5 c1b2 b8a6 e2e4 g8f6 f1c4 d5c4 d2d4 c4c3 b2c3 a6c5 c3b2 c5e6 g1f3 e6d4 b2c3 d4f5 c3b4 f5d4"


def test_the_engine_avoids_a_repetition_of_the_game_the_gui_sent():
    commands = f"position startpos moves {REPEATING}\ngo\nquit\n"
    answers = {}
    for threshold in (None, -10.0):
        out = io.StringIO()
        player = ModelPlayer.load(threads=1, avoid_repetition=threshold, fallback="listed")
        serve(player, "test", io.StringIO(commands), out)
        answers[threshold] = out.getvalue().splitlines()
    assert answers[None] == ["bestmove b4c3"]  # the model's own move: a repetition
    board = parse_position(["startpos", "moves", *REPEATING.split()])
    note, best = answers[-10.0]
    assert note.startswith("info string B: b4c3 repeats a position; played ")
    move = chess.Move.from_uci(best.split()[1])
    assert move != chess.Move.from_uci("b4c3") and move in board.legal_moves and not repeats(board, move)


def test_python_chess_plays_a_short_game_against_it():
    command = [sys.executable, "-m", "rookworld.cli", "uci", "--threads", "1", "--avoid-repetition", "1",
               "--votes", "4"]
    engine = chess.engine.SimpleEngine.popen_uci(command, timeout=120)
    try:
        assert engine.id["name"] == "rookworld (embedded model)"
        board, rng = chess.Board(), random.Random(0)
        for _ in range(4):  # the engine plays white, a random mover black
            result = engine.play(board, chess.engine.Limit(time=0.1))
            assert result.move in board.legal_moves
            board.push(result.move)
            if board.is_game_over():
                break
            board.push(rng.choice(list(board.legal_moves)))
        assert len(board.move_stack) >= 7
    finally:
        engine.quit()


def test_a_bad_vote_count_is_a_one_line_error(capsys):
    from rookworld.cli import main

    assert main(["uci", "--votes", "0"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("rookworld uci: error: --votes 0: must be >= 1") and error.count("\n") == 1
