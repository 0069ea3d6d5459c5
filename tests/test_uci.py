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
from rookworld.uci import MAX_THREADS, describe, info_line, listed_eval, parse_position, serve, time_budget

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
                "go wtime 100000 btime 100000", "position nonsense", "position moves e2e4", "stop",
                "position fen 6k1/5ppp/8/8/8/8/5PPP/3r2K1 w - - 0 30", "go depth 5", "quit", "isready"]
    out = io.StringIO()
    serve(player, "test", io.StringIO("\n".join(commands) + "\n"), out)
    lines = out.getvalue().splitlines()
    assert lines[:5] == ["id name rookworld (test)", "id author rookworld",
                         "option name Votes type spin default 1 min 1 max 64",
                         "option name AvoidRepetition type string default off",
                         "option name Readout type combo default b var b var first"]
    assert lines[5:7] == [f"option name Threads type spin default 1 min 1 max {MAX_THREADS}", "uciok"]
    at = next(i for i, line in enumerate(lines) if line.startswith("bestmove"))
    move = chess.Move.from_uci(lines[at].split()[1])
    assert move in parse_position(["startpos", "moves", "e2e4"]).legal_moves
    assert lines[at - 1].startswith("info depth 1 score cp ") and lines[at - 1].endswith(f" pv {move.uci()}")
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
    lines = [line for line in out.getvalue().splitlines() if not line.startswith("info")]
    assert [line.split()[0] for line in lines] == ["readyok", "bestmove"] * 3 + ["bestmove"]
    board = parse_position(["startpos", "moves", "e2e4"])
    assert all(chess.Move.from_uci(line.split()[1]) in board.legal_moves for line in lines[1:6:2])
    assert lines[-1] == "bestmove 0000"  # and nothing for the go infinite that quit ended


# a game of the embedded model against itself from two random plies: black's greedy d6f8 would bring back the
# position after the 10th ply (its bishop's return after white's d3c4 and c4d3)
REPEATING = "g1f3 d7d6 d2d4 e7e5 d4e5 d6e5 e2e4 b8c6 f1d3 g8f6 d3c4 f8d6 c4d3"


def test_the_engine_avoids_a_repetition_of_the_game_the_gui_sent():
    commands = f"position startpos moves {REPEATING}\ngo\nquit\n"
    answers = {}
    for threshold in (None, -10.0):
        out = io.StringIO()
        player = ModelPlayer.load(threads=1, avoid_repetition=threshold, fallback="listed")
        serve(player, "test", io.StringIO(commands), out)
        answers[threshold] = out.getvalue().splitlines()
    info, best = answers[None]
    assert best == "bestmove d6f8" and info.startswith("info depth 1 score cp ") and info.endswith(" pv d6f8")
    board = parse_position(["startpos", "moves", *REPEATING.split()])
    note, info, best = answers[-10.0]
    assert info.endswith(" pv " + best.split()[1])
    assert note.startswith("info string B: d6f8 repeats a position; played ")
    move = chess.Move.from_uci(best.split()[1])
    assert move != chess.Move.from_uci("d6f8") and move in board.legal_moves and not repeats(board, move)


def test_setoption_sets_the_rules_and_threads_and_says_what_it_ignored():
    import torch

    player = ModelPlayer.load(threads=1, fallback="listed")
    commands = ["setoption name Votes value 5", "setoption name avoidrepetition value 0.5",
                f"setoption name Threads value {MAX_THREADS}", "uci",
                "setoption name Votes value 0", "setoption name Votes value many", "setoption name Votes value 65",
                "setoption name AvoidRepetition value ahead", "setoption name Hash value 16", "setoption Votes",
                "setoption name Votes value \u00b2", f"setoption name Threads value {MAX_THREADS + 1}",
                "isready"]  # '²' is a digit to str.isdigit, not to int()
    out = io.StringIO()
    try:
        serve(player, "test", io.StringIO("\n".join(commands) + "\n"), out)
        assert torch.get_num_threads() == MAX_THREADS
    finally:
        torch.set_num_threads(1)
    lines = out.getvalue().splitlines()
    assert lines[2:6] == ["option name Votes type spin default 5 min 1 max 64",
                          "option name AvoidRepetition type string default 0.5",
                          "option name Readout type combo default b var b var first",
                          f"option name Threads type spin default {MAX_THREADS} min 1 max {MAX_THREADS}"]
    assert lines[7:] == ["info string ignored setoption Votes '0': give a whole number from 1 to 64",
                         "info string ignored setoption Votes 'many': give a whole number from 1 to 64",
                         "info string ignored setoption Votes '65': give a whole number from 1 to 64",
                         "info string ignored setoption AvoidRepetition 'ahead': give the pawns (e.g. 1) or off",
                         "info string ignored setoption Votes '\u00b2': give a whole number from 1 to 64",
                         f"info string ignored setoption Threads '{MAX_THREADS + 1}': give a whole number from 1 to "
                         f"{MAX_THREADS}", "readyok"]
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


def test_python_chess_plays_a_short_game_against_it_and_analyses():
    command = [sys.executable, "-m", "rookworld.cli", "uci", "--threads", "1", "--votes", "4"]
    engine = chess.engine.SimpleEngine.popen_uci(command, timeout=120)
    try:
        assert engine.id["name"] == "rookworld (embedded model)"
        assert (engine.options["Votes"].default, engine.options["AvoidRepetition"].default) == (4, "1")
        assert engine.options["Threads"].default == 1
        engine.configure({"Votes": 3, "AvoidRepetition": "0.5", "Threads": 1})  # python-chess checks the bounds
        info = engine.analyse(chess.Board(), chess.engine.Limit(time=30))
        assert info["depth"] == 1 and len(info["pv"]) == 1 and info["pv"][0] in chess.Board().legal_moves
        assert info["score"].turn == chess.WHITE and abs(info["score"].relative.score()) < 100  # the model's E:
        board, rng = chess.Board(), random.Random(0)
        for _ in range(4):  # the engine plays white, a random mover black
            result = engine.play(board, chess.engine.Limit(white_clock=60, black_clock=60),
                                 info=chess.engine.INFO_ALL)
            assert result.move in board.legal_moves and result.info["pv"] == [result.move]
            assert board.ply() > 0 or result.info["score"].relative.score() is not None  # the model's E: of it
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


def test_the_info_line_carries_the_models_eval_of_the_move_played():
    board, e2e4 = chess.Board(), chess.Move.from_uci("e2e4")
    completion = "M: d2d4 e2e4 g1f3 E: 0.31 -0.2 B: d2d4"
    assert listed_eval(board, completion, e2e4) == -0.2
    assert listed_eval(board, completion, chess.Move.from_uci("g1f3")) is None  # listed without an eval
    assert listed_eval(board, "garbage", e2e4) is None
    castle = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    assert listed_eval(castle, "M: e1h1 E: 0.5 B: e1h1", chess.Move.from_uci("e1g1")) == 0.5  # king takes rook
    assert info_line(e2e4, -0.2) == "info depth 1 score cp -20 pv e2e4"
    assert info_line(e2e4, 3.456) == "info depth 1 score cp 346 pv e2e4"
    assert info_line(e2e4, 999.97) == "info depth 1 score mate 3 pv e2e4"  # the protocol's mate in 3
    assert info_line(e2e4, -999.99) == "info depth 1 score mate -1 pv e2e4"  # mated in 1
    assert info_line(e2e4, 1000.0) == "info depth 1 score mate 1 pv e2e4"
    assert info_line(e2e4, None) == "info depth 1 pv e2e4"
    parsed = chess.engine._parse_uci_info("depth 1 score mate -1 pv e2e4", board)  # as python-chess reads it
    assert parsed["score"].relative == chess.engine.Mate(-1) and parsed["pv"] == [e2e4]


def test_the_time_a_go_allows():
    assert time_budget(["movetime", "1000"], chess.WHITE) == pytest.approx(0.9)
    assert time_budget(["wtime", "60000", "btime", "3000"], chess.WHITE) == pytest.approx(0.9 * 2.0)  # 60 s / 30
    assert time_budget(["wtime", "60000", "btime", "3000"], chess.BLACK) == pytest.approx(0.9 * 0.1)
    assert time_budget(["wtime", "60000", "winc", "1000", "movestogo", "10"], chess.WHITE) == pytest.approx(0.9 * 7)
    assert time_budget(["btime", "2000", "binc", "5000"], chess.BLACK) == pytest.approx(0.9 * 1.0)  # half the clock
    assert time_budget(["wtime", "60000", "movetime", "500"], chess.WHITE) == pytest.approx(0.45)  # the smaller
    assert time_budget(["wtime", "-50"], chess.WHITE) == 0.0
    for unlimited in ([], ["depth", "5"], ["infinite"], ["ponder", "wtime", "1000"], ["movetime", "5", "infinite"]):
        assert time_budget(unlimited, chess.WHITE) is None
    for bad in (["movetime"], ["wtime", "1.5"], ["movetime", "soon"]):
        with pytest.raises(ValueError, match="give whole milliseconds"):
            time_budget(bad, chess.WHITE)


def test_go_answers_within_the_time_it_allows():
    import time

    player = ModelPlayer.load(threads=1, fallback="listed")
    board = parse_position(["startpos", "moves", "e2e4"])
    class Timed(io.StringIO):  # what the GUI reads, with the time the bestmove came
        def write(self, text: str) -> int:
            if text.startswith("bestmove"):
                self.answered = time.perf_counter()
            return super().write(text)

    for limits, cut in (("movetime 1", True), ("wtime 30 btime 30", True), ("movetime 60000", False),
                        ("wtime 600000 btime 600000 winc 1000 binc 1000", False), ("movetime soon", False)):
        out = Timed()
        started = time.perf_counter()
        serve(player, "test", io.StringIO(f"position startpos moves e2e4\ngo {limits}\n"), out)
        elapsed = out.answered - started
        *said, best = out.getvalue().splitlines()
        move = chess.Move.from_uci(best.split()[1])
        assert best.startswith("bestmove") and move in board.legal_moves
        assert said[-1] == info_line(move, None) if cut else said[-1].startswith("info depth 1 score cp ")
        assert (said[0].startswith("info string the model's move was not found within the 0.00")) == cut, said
        if cut:
            assert elapsed < 0.5  # answered at its limit (about 1 ms), not when the model had its move
        assert ("ignored the time limits: go movetime 'soon'" in said[0]) == (limits == "movetime soon")
