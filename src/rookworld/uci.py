"""`rookworld uci [--model M] [--threads K] [--seed S] [--avoid-repetition PAWNS|off] [--votes K] [--readout b|first]`:
the model as a UCI engine on stdin/stdout.

Any chess GUI, tournament manager or bot bridge that speaks UCI can run it. On `go` the engine finds the model's
move (`player.ModelPlayer`) within the time `go` allows (`time_budget`; when it runs out, a random legal move, said in
an `info string`): by default the legal `B:` move
most of 8 sampled completions name, and when the model rates itself ahead by a pawn, not one that repeats an
earlier position of the game the GUI sent (`position ... moves ...`) if one of its `M:` candidates avoids it:
the player rules that measured strongest (docs/play.md), unlike `rookworld play`, whose defaults measure the
model's greedy move. When the chosen move is illegal or missing, the engine plays the legal move its own
`M:`/`E:` list rates best, else a random legal move (seeded), and says which in an `info string`. With
`--readout first` it plays the legal move the model scores highest as its first `M:` candidate (readout.py). Before
`bestmove` it sends `info depth 1 score ... pv MOVE`, the score the model's own `E:` eval of the move played
(`info_line`). It answers `bestmove` as soon as the move is found, except where UCI asks it to wait: after
`go infinite` until `stop`, after `go ponder` until `stop` or `ponderhit`. The rules are also UCI options (`Votes`,
`AvoidRepetition`, `Readout`, and `Threads` for torch's threads), so a GUI can set them.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import TextIO

import chess

from rookworld.analysis import is_mate_score, pawns_to_mate
from rookworld.arbiter import legal_move
from rookworld.errors import UserError
from rookworld.player import (
    READOUTS,
    Choice,
    ModelPlayer,
    add_readout_argument,
    add_repetition_argument,
    add_votes_argument,
    best_listed,
    repetition_pawns,
)
from rookworld.text import parse_p_completion

ENGINE_NAME = "rookworld"
VOTES = 8  # a vote of 8: +65 Elo over the greedy move in 200 games against the same model (docs/play.md)
AVOID_REPETITION = 1.0  # pawns: +41 Elo over repeating, 400 games against the same model (docs/play.md)
MAX_VOTES = 64  # the Votes option's upper bound, which UCI's spin type needs
MAX_THREADS = os.cpu_count() or 1  # the Threads option's upper bound
MOVES_TO_GO = 30  # the moves a clock without movestogo is shared among
TIME_SHARE = 0.9  # of the time a move may take, what the model may use (the rest: answering, the GUI's pipe)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory or hub id (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: every core; 1 when the GUI runs other engines)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random fallback move and of --votes' samples (default: 0)")
    add_repetition_argument(parser, default=AVOID_REPETITION)
    add_votes_argument(parser, default=VOTES)
    add_readout_argument(parser)


def describe(board: chess.Board, choice: Choice) -> str | None:
    """What to say in an `info string` about a choice: nothing for the model's own `B:` move; else the candidate
    that replaced it to avoid a repetition, or what replaced an illegal or missing one: the best legal move of its
    `M:`/`E:` list (the engine's fallback) or a random legal move."""
    if choice.avoided is not None:
        return (f"B: {choice.avoided.uci()} repeats a position; played {choice.move.uci()}, the best move of the "
                "model's M:/E: list that does not")
    if choice.own:
        return None
    parsed = parse_p_completion(choice.completion)
    said = f"B: {parsed.best!r} is not a legal move" if parsed.best else "no B: move"
    listed = best_listed(board, parsed)
    if listed == choice.move:
        return f"{said}; played {listed.uci()}, the best legal move of the model's M:/E: list"
    none = " and no M: move is legal" if listed is None else ""
    return f"{said}{none}; played the random legal move {choice.move.uci()}"


def parse_position(tokens: list[str]) -> chess.Board:
    """The board of `position startpos|fen <6 fields> [moves m1 m2 ...]` (tokens after `position`);
    ValueError for a malformed command or an illegal move."""
    if not tokens:
        raise ValueError("position needs startpos or fen")
    if "moves" in tokens:
        cut = tokens.index("moves")
        setup, moves = tokens[:cut], tokens[cut + 1:]
    else:
        setup, moves = tokens, []
    if setup == ["startpos"]:
        board = chess.Board()
    elif setup[:1] == ["fen"] and len(setup) > 1:
        board = chess.Board(" ".join(setup[1:]))
    else:
        raise ValueError(f"position {' '.join(tokens)!r}: expected startpos or fen <FEN>")
    for uci in moves:
        board.push_uci(uci)  # ValueError (IllegalMoveError) for a move that is not legal there
    return board


def options(player: ModelPlayer) -> list[str]:
    """The `option` lines of the answer to `uci`: the player's rules and torch's threads, at their current values."""
    import torch

    pawns = "off" if player.avoid_repetition is None else f"{player.avoid_repetition:g}"
    readouts = " ".join(f"var {name}" for name in READOUTS)
    return [f"option name Votes type spin default {player.votes} min 1 max {MAX_VOTES}",
            f"option name AvoidRepetition type string default {pawns}",
            f"option name Readout type combo default {player.readout} {readouts}",
            f"option name Threads type spin default {min(torch.get_num_threads(), MAX_THREADS)} min 1 "
            f"max {MAX_THREADS}"]


def set_option(player: ModelPlayer, tokens: list[str]) -> str | None:
    """Apply `setoption name <id> value <x>` (tokens after `setoption`; names are case-insensitive) to `player`;
    what to say in an `info string` when the option is one of ours and its value is bad, else None. Other
    engines' options (Hash, MultiPV, ...) are ignored, as UCI asks."""
    if "name" not in tokens:
        return None
    cut = tokens.index("value") if "value" in tokens else len(tokens)
    name, value = " ".join(tokens[tokens.index("name") + 1:cut]).lower(), " ".join(tokens[cut + 1:])
    if name in ("votes", "threads"):
        shown, most = ("Votes", MAX_VOTES) if name == "votes" else ("Threads", MAX_THREADS)
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= most:  # int() refuses '²'
            return f"ignored setoption {shown} {value!r}: give a whole number from 1 to {most}"
        if name == "votes":
            player.votes = int(value)
        else:
            import torch

            torch.set_num_threads(int(value))
    elif name == "readout":
        if value not in READOUTS:
            return f"ignored setoption Readout {value!r}: give one of {', '.join(READOUTS)}"
        player.readout = value
    elif name == "avoidrepetition":
        try:
            player.avoid_repetition = repetition_pawns(value)
        except argparse.ArgumentTypeError as exc:
            return f"ignored setoption AvoidRepetition {exc}"
    return None


def listed_eval(board: chess.Board, completion: str, move: chess.Move) -> float | None:
    """The `E:` eval a P completion gives `move` (in pawns, the side to move's view): that of the first of its `M:`
    candidates naming it; None when none does, or that candidate has no eval."""
    parsed = parse_p_completion(completion)
    return next((parsed.evals[i] for i, uci in enumerate(parsed.moves)
                 if i < len(parsed.evals) and legal_move(board, uci) == move), None)


def info_line(move: chess.Move, pawns: float | None) -> str:
    """`info depth 1 score cp X pv MOVE`: X the model's eval `pawns` in centipawns, or `score mate N` for a mate
    score (analysis.pawns_to_mate, in moves, negative when mated); without a score when `pawns` is None."""
    if pawns is None:
        score = ""
    elif is_mate_score(pawns):
        score = f" score mate {pawns_to_mate(pawns)}"
    else:
        score = f" score cp {round(pawns * 100)}"
    return f"info depth 1{score} pv {move.uci()}"


def time_budget(limits: list[str], turn: chess.Color) -> float | None:
    """The seconds a `go <limits>` may take, None for no limit (infinite, ponder, or no time given): of
    `movetime`, and of the side to move's clock (`wtime`/`btime`) its share of the moves to go (`movestogo`, else
    30) plus its increment (`winc`/`binc`), at most half the clock; TIME_SHARE of the smaller. ValueError for a
    time that is not a whole number."""
    if "infinite" in limits or "ponder" in limits:
        return None
    values = {}
    for key in ("movetime", "wtime", "btime", "winc", "binc", "movestogo"):
        if key in limits:
            at = limits.index(key) + 1
            value = limits[at] if at < len(limits) else ""
            if not value.lstrip("-").isdigit():
                raise ValueError(f"go {key} {value!r}: give whole milliseconds")
            values[key] = int(value)
    spans = [values["movetime"] / 1000] if "movetime" in values else []
    clock, increment = ("wtime", "winc") if turn == chess.WHITE else ("btime", "binc")
    if clock in values:
        left = max(0, values[clock]) / 1000
        share = left / max(1, values.get("movestogo", MOVES_TO_GO)) + max(0, values.get(increment, 0)) / 1000
        spans.append(min(share, left / 2))
    return TIME_SHARE * max(0.0, min(spans)) if spans else None


class Thinker:
    """Finds the player's moves in worker threads, one at a time: a move cut short by its time limit finishes in
    the background before the next one starts."""

    def __init__(self, player: ModelPlayer) -> None:
        self.player = player
        self.worker: threading.Thread | None = None

    def answer(self, board: chess.Board, budget: float | None = None) -> tuple[str, list[str]]:
        """The `bestmove` line for `board`, and the lines to say before it: an `info string` about the choice
        (`describe`), if any, and `info_line` with the model's eval of the move played (from the completion the
        choice acted on, or a greedy one when it acted on none: the first-candidate readout). When the model's move
        is not found within `budget` seconds the engine plays a random legal move (seeded) and says so."""
        if not any(board.legal_moves):
            return "bestmove 0000", []  # mate or stalemate: UCI's null move
        found: list[tuple[Choice, str]] = []
        failed: list[BaseException] = []
        own, previous, player = board.copy(), self.worker, self.player

        def think() -> None:
            if previous is not None:
                previous.join()
            try:
                choice = player.choose([own])[0]
                found.append((choice, choice.completion or player.complete([own])[0]))
            except BaseException as exc:  # raised again where the answer is awaited
                failed.append(exc)

        self.worker = threading.Thread(target=think, daemon=True)
        self.worker.start()
        self.worker.join(budget)
        if failed:
            raise failed[0]
        if not found:
            move = player.rng.choice(list(board.legal_moves))
            return f"bestmove {move.uci()}", [f"info string the model's move was not found within the {budget:.3f} s "
                                              f"the time limits allow; played the random legal move {move.uci()}",
                                              info_line(move, None)]
        choice, completion = found[0]
        note = describe(board, choice)
        lines = [] if note is None else [f"info string {note}"]
        lines.append(info_line(choice.move, listed_eval(board, completion, choice.move)))
        return f"bestmove {choice.move.uci()}", lines

    def finish(self) -> None:
        """Waits for a move still being found (the process may not end inside the model)."""
        if self.worker is not None:
            self.worker.join()


def released_by(limits: list[str]) -> set[str]:
    """The commands a `go <limits>` answer waits for (UCI: no `bestmove` before them); none: answer at once.
    `go infinite` waits for `stop`; `go ponder` also for `ponderhit`, after which it searches as its other limits
    say, and the model's move is already found (unless they say infinite)."""
    if "infinite" in limits:
        return {"stop"}
    return {"stop", "ponderhit"} if "ponder" in limits else set()


def serve(player: ModelPlayer, name: str, stdin: TextIO, stdout: TextIO) -> None:
    """Answer UCI commands from `stdin` until `quit` or end of input (`player`: the engine's has the listed
    fallback)."""

    def say(line: str) -> None:
        stdout.write(line + "\n")
        stdout.flush()

    thinker = Thinker(player)
    try:
        _serve(thinker, name, stdin, say)
    finally:
        thinker.finish()


def _serve(thinker: Thinker, name: str, stdin: TextIO, say) -> None:
    """The command loop of `serve`, saying its answers with `say`."""
    player = thinker.player
    board = chess.Board()
    held, release = "", set()  # a `bestmove` line that waits for one of the `release` commands
    for raw in stdin:
        tokens = raw.split()
        if not tokens:
            continue
        command, rest = tokens[0], tokens[1:]
        if command == "uci":
            say(f"id name {ENGINE_NAME} ({name})")
            say(f"id author {ENGINE_NAME}")
            for line in options(player):
                say(line)
            say("uciok")
        elif command == "isready":
            say("readyok")
        elif command == "ucinewgame":
            board = chess.Board()
        elif command == "position":
            try:
                board = parse_position(rest)
            except ValueError as exc:
                say(f"info string ignored position: {exc}")
        elif command == "setoption":
            note = set_option(player, rest)
            if note:
                say(f"info string {note}")
        elif command == "go":
            try:
                budget = time_budget(rest, board.turn)
            except ValueError as exc:
                say(f"info string ignored the time limits: {exc}")
                budget = None
            held, lines = thinker.answer(board, budget)
            for line in lines:
                say(line)
            release = released_by(rest)
            if not release:
                say(held)
        elif command in release:  # `stop` or `ponderhit` ends the wait for the held answer
            say(held)
            release = set()
        elif command == "quit":
            return
        # `stop` and `ponderhit` with no answer held, `debug`, `register` and unknown commands: nothing to do
        # (UCI: ignore)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.votes <= MAX_VOTES:
        raise UserError(f"--votes {args.votes}: must be from 1 (the greedy B: move) to {MAX_VOTES}")
    player = ModelPlayer.load(args.model, threads=args.threads, seed=args.seed,
                              avoid_repetition=args.avoid_repetition, fallback="listed", votes=args.votes,
                              readout=args.readout)
    serve(player, args.model or "embedded model", sys.stdin, sys.stdout)
    return 0
