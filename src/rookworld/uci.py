"""`rookworld uci [--model M] [--threads K] [--seed S] [--avoid-repetition PAWNS|off] [--votes K] [--readout b|first]`:
the model as a UCI engine on stdin/stdout.

Any chess GUI, tournament manager or bot bridge that speaks UCI can run it. On `go` (whatever its
limits) the engine finds the model's move at once (`player.ModelPlayer`): by default the legal `B:` move
most of 8 sampled completions name, and when the model rates itself ahead by a pawn, not one that repeats an
earlier position of the game the GUI sent (`position ... moves ...`) if one of its `M:` candidates avoids it:
the player rules that measured strongest (docs/play.md), unlike `rookworld play`, whose defaults measure the
model's greedy move. When the chosen move is illegal or missing, the engine plays the legal move its own
`M:`/`E:` list rates best, else a random legal move (seeded), and says which in an `info string`. With
`--readout first` it plays the legal move the model scores highest as its first `M:` candidate (readout.py). It answers
`bestmove` at once too, except where UCI asks it to wait: after `go infinite` until `stop`, after `go ponder`
until `stop` or `ponderhit`. The rules are also UCI options (`Votes`, `AvoidRepetition`, `Readout`),
so a GUI can set them.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import chess

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
    """The `option` lines of the answer to `uci`: the player's rules, at their current values."""
    pawns = "off" if player.avoid_repetition is None else f"{player.avoid_repetition:g}"
    readouts = " ".join(f"var {name}" for name in READOUTS)
    return [f"option name Votes type spin default {player.votes} min 1 max {MAX_VOTES}",
            f"option name AvoidRepetition type string default {pawns}",
            f"option name Readout type combo default {player.readout} {readouts}"]


def set_option(player: ModelPlayer, tokens: list[str]) -> str | None:
    """Apply `setoption name <id> value <x>` (tokens after `setoption`; names are case-insensitive) to `player`;
    what to say in an `info string` when the option is one of ours and its value is bad, else None. Other
    engines' options (Hash, Threads, ...) are ignored, as UCI asks."""
    if "name" not in tokens:
        return None
    cut = tokens.index("value") if "value" in tokens else len(tokens)
    name, value = " ".join(tokens[tokens.index("name") + 1:cut]).lower(), " ".join(tokens[cut + 1:])
    if name == "votes":
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_VOTES:  # int() refuses '²'
            return f"ignored setoption Votes {value!r}: give a whole number from 1 to {MAX_VOTES}"
        player.votes = int(value)
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


def answer(player: ModelPlayer, board: chess.Board) -> tuple[str, str | None]:
    """The `bestmove` line for `board`, and what to say first in an `info string` (`describe`), if anything."""
    if not any(board.legal_moves):
        return "bestmove 0000", None  # mate or stalemate: UCI's null move
    choice = player.choose([board])[0]
    return f"bestmove {choice.move.uci()}", describe(board, choice)


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
            held, note = answer(player, board)
            if note:
                say(f"info string {note}")
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
