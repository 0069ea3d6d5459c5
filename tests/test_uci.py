"""`rookworld uci`: the model as a UCI engine, driven by python-chess's own UCI client."""

from __future__ import annotations

import argparse
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
    for bad in ([], ["fen"], ["middlegame"], ["startpos", "moves", "e2e5"], ["moves", "e2e4"]):
        with pytest.raises(ValueError):
            parse_position(bad)


def test_serve_answers_every_command_with_the_embedded_model():
    player = ModelPlayer.load(threads=1, fallback="listed")
    commands = ["uci", "isready", "setoption name Hash value 16", "ucinewgame", "position startpos moves e2e4",
                "go wtime 1000 btime 1000", "position nonsense", "position moves e2e4", "stop",
                "position fen 6k1/5ppp/8/8/8/8/5PPP/3r2K1 w - - 0 30", "go depth 5", "quit", "isready"]
    out = io.StringIO()
    serve(player, "test", io.StringIO("\n".join(commands) + "\n"), out)
    lines = out.getvalue().splitlines()
    assert lines[:7] == ["id name rookworld (test)", "id author rookworld",
                         "option name Votes type spin default 1 min 1 max 64",
                         "option name AvoidRepetition type string default off",
                         "option name Readout type combo default b var b var first", "uciok", "readyok"]
    first = next(line for line in lines if line.startswith("bestmove"))
    assert chess.Move.from_uci(first.split()[1]) in parse_position(["startpos", "moves", "e2e4"]).legal_moves
    assert sum(line.startswith("info string ignored position") for line in lines) == 2
    assert lines[-1] == "bestmove 0000"  # white is mated there; and nothing is answered after quit


def test_go_infinite_and_go_ponder_hold_the_bestmove_until_stop_or_ponderhit():
    player = ModelPlayer.load(threads=1, fallback="listed")
    commands = ["position startpos moves e2e4", "go infinite", "isready", "stop", "stop",
                "go ponder wtime 1000 btime 1000", "isready", "ponderhit",
                "go ponder infinite", "ponderhit", "isready", "stop",  # infinite after the ponderhit: until stop
                "position fen 6k1/5ppp/8/8/8/8/5PPP/3r2K1 w - - 0 30", "go infinite", "stop",  # mated: 0000, held
                "go infinite", "quit", "stop"]
    out = io.StringIO()
    serve(player, "test", io.StringIO("\n".join(commands) + "\n"), out)
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("info string")]
    assert [line.split()[0] for line in lines] == ["readyok", "bestmove"] * 3 + ["bestmove"]
    board = parse_position(["startpos", "moves", "e2e4"])
    assert all(chess.Move.from_uci(line.split()[1]) in board.legal_moves for line in lines[1:6:2])
    assert lines[-1] == "bestmove 0000"  # and nothing for the go infinite that quit ended


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


def test_setoption_sets_the_two_rules_and_says_what_it_ignored():
    player = ModelPlayer.load(threads=1, fallback="listed")
    commands = ["setoption name Votes value 5", "setoption name avoidrepetition value 0.5", "uci",
                "setoption name Votes value 0", "setoption name Votes value many", "setoption name Votes value 65",
                "setoption name AvoidRepetition value ahead", "setoption name Hash value 16", "setoption Votes",
                "setoption name Votes value \u00b2", "isready"]  # '²' is a digit to str.isdigit, not to int()
    out = io.StringIO()
    serve(player, "test", io.StringIO("\n".join(commands) + "\n"), out)
    lines = out.getvalue().splitlines()
    assert lines[2:5] == ["option name Votes type spin default 5 min 1 max 64",
                          "option name AvoidRepetition type string default 0.5",
                          "option name Readout type combo default b var b var first"]
    assert lines[6:] == ["info string ignored setoption Votes '0': give a whole number from 1 to 64",
                         "info string ignored setoption Votes 'many': give a whole number from 1 to 64",
                         "info string ignored setoption Votes '65': give a whole number from 1 to 64",
                         "info string ignored setoption AvoidRepetition 'ahead': give the pawns (e.g. 1) or off",
                         "info string ignored setoption Votes '\u00b2': give a whole number from 1 to 64",
                         "readyok"]
    assert (player.votes, player.avoid_repetition) == (5, 0.5)  # the bad values changed nothing
    serve(player, "test", io.StringIO("setoption name AvoidRepetition value OFF\nsetoption name Votes value 1\n"),
          io.StringIO())
    assert (player.votes, player.avoid_repetition) == (1, None)


def test_the_engine_defaults_to_the_strongest_measured_rules():
    from rookworld import play, uci

    def parse(module, argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        return parser.parse_args(argv)

    assert (parse(uci, []).votes, parse(uci, []).avoid_repetition) == (8, 1.0)
    assert parse(uci, ["--avoid-repetition", "off", "--votes", "1"]).avoid_repetition is None
    args = parse(play, ["--opponent", "random"])  # play measures the model: greedy, repetitions allowed
    assert (args.votes, args.avoid_repetition, args.opponent_avoid_repetition) == (1, None, None)
    assert parse(play, ["--opponent", "model", "--opponent-avoid-repetition", "Off"]).opponent_avoid_repetition is None


def test_a_bad_repetition_threshold_is_an_error_naming_it(capsys):
    from rookworld.cli import main

    with pytest.raises(SystemExit):
        main(["uci", "--avoid-repetition", "ahead"])
    assert "--avoid-repetition: 'ahead': give the pawns (e.g. 1) or off" in capsys.readouterr().err


def test_python_chess_plays_a_short_game_against_it():
    command = [sys.executable, "-m", "rookworld.cli", "uci", "--threads", "1", "--votes", "4"]
    engine = chess.engine.SimpleEngine.popen_uci(command, timeout=120)
    try:
        assert engine.id["name"] == "rookworld (embedded model)"
        assert (engine.options["Votes"].default, engine.options["AvoidRepetition"].default) == (4, "1")
        engine.configure({"Votes": 3, "AvoidRepetition": "0.5"})  # python-chess checks the spin's bounds
        board, rng = chess.Board(), random.Random(0)
        for _ in range(4):  # the engine plays white, a random mover black
            result = engine.play(board, chess.engine.Limit(time=0.1))
            assert result.move in board.legal_moves
            board.push(result.move)
            if board.is_game_over():
                break
            board.push(rng.choice(list(board.legal_moves)))
        assert len(board.move_stack) >= 7
        with engine.analysis(board) as analysis:  # go infinite: the bestmove comes after python-chess's stop
            analysis.stop()
            assert analysis.wait().move in board.legal_moves
    finally:
        engine.quit()


def test_a_bad_vote_count_is_a_one_line_error(capsys):
    from rookworld.cli import main

    for votes in ("0", "65"):
        assert main(["uci", "--votes", votes]) == 2
        error = capsys.readouterr().err
        assert error == f"rookworld uci: error: --votes {votes}: must be from 1 (the greedy B: move) to 64\n"
