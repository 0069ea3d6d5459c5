"""`rookworld play --opponent random|stockfish|self|model [--skill N] [--opponent-model M] [--games N]
[--fallback random|listed] [--avoid-repetition PAWNS] [--votes K] [--readout b|first] [--opponent-fallback ...]
[--opponent-avoid-repetition ...] [--opponent-votes K] [--opponent-readout b|first] [--world rules|model] [--out F]`

Games of a model (its greedy `B:` move, see player.py) against a seeded random mover, Stockfish at a
skill level, itself, or another model (a match, as engine authors test a new version against the old).
The model is white in the even games. Each game may start after a few seeded random plies
(--opening-plies), so that greedy games differ; against an opponent games 2k and 2k + 1 share their
opening, played once with each colour, so an opening's bias for one side cancels in the score. All games
advance in lockstep, so each ply is one batched generation for every game where a model is to move.

Self-play measures what RookWorld reported as "legal half-moves in self-play": the model plays both
sides and a game stops at its first illegal or missing move (no random fallback), so the number of
legal moves played before it is the measure (censored by the rules' ends and --max-plies).

Games end by python-chess's rules; threefold repetition and the fifty-move rule end them as soon as
they hold (the draw is claimed). A game still running after --max-plies is adjudicated by Stockfish's
eval of its final position at the P labels' limit: won by the side ahead by at least --adjudicate
pawns, else drawn (a model that wins material from a random mover but cannot mate would otherwise
draw every game). The model's moves are then judged by Stockfish at the same limit (quality.py):
`acpl` is their mean loss in pawns, an illegal or missing move counting as the cap. `mate_in_one` is
the share of the model's turns with a mate in one (`mate_chances`) where its own move mated: the depth-10
loss cannot see a missed mate when the other move keeps a won position (both evals clip to 10 pawns).
With --fallback listed an illegal or missing `B:` move is replaced by the model's own best-rated legal
`M:` candidate instead (as `rookworld uci` plays; still counted as illegal and judged at the cap).
With --avoid-repetition the model sets aside a `B:` move that repeats a position when it rates itself
ahead (player.py), and with --opponent-avoid-repetition a model opponent does; `repetitions_avoided` and
`opponent_repetitions_avoided` count those moves. With --votes K (and --opponent-votes K for a model
opponent) the player samples K completions a move and plays the legal `B:` move most of them name (player.py).
With --readout first (and --opponent-readout first) the player plays the legal move it scores highest as its
first `M:` candidate (readout.py), so it never plays an illegal move.
With --world model each move's next state comes from the model's own A completion (world.py), one batched A
generation a ply: the game goes on from the states it writes, and every transition is checked by the arbiter.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import chess

from rookworld.config import finite_float
from rookworld.data.cases import mating_moves
from rookworld.errors import UserError
from rookworld.fsutil import output_file
from rookworld.metrics import Estimate, estimate, json_se
from rookworld.player import (
    FALLBACKS,
    READOUTS,
    ModelPlayer,
    add_readout_argument,
    add_repetition_argument,
    add_votes_argument,
)
from rookworld.text import is_uci_shaped, parse_p_completion
from rookworld.world import ENDS, WORLDS, Line, Step, World, after, describe, divergence
from rookworld.world import summary as world_summary

OPPONENTS = ("random", "stockfish", "self", "model")
PLY_LIMIT = "ply limit adjudication"
SELF_PLY_LIMIT = "ply limit"  # a self-play game still running: no side to adjudicate for
ILLEGAL = "illegal move"  # a self-play game's end: the model wrote an illegal or no `B:` move
MAX_PLIES = 200
GREEDY_OPENING_PLIES = 4  # 197,281 four-ply starts (perft 4), drawn ply by ply: 100 games rarely repeat one
POINTS = {"win": 1.0, "draw": 0.5, "loss": 0.0}
EMBEDDED_NAME = "rookworld embedded model"
ADJUDICATE_PAWNS = 5.0  # a rook and more: decisive, and beyond the noise of a depth-10 eval


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory or hub id (default: the embedded model)")
    parser.add_argument("--opponent", required=True,
                        help="random (uniform legal moves), stockfish, self (the model on both sides; a game "
                             "stops at its first illegal move) or model (--opponent-model, e.g. the model a run "
                             "started from)")
    parser.add_argument("--opponent-model", default=None, metavar="MODEL",
                        help="checkpoint directory or hub id of the opponent with --opponent model (default: the "
                             "embedded model)")
    parser.add_argument("--skill", type=int, default=None,
                        help="Stockfish's UCI Skill Level, 0..20 (default: 0; only with --opponent stockfish)")
    parser.add_argument("--depth", type=int, default=None,
                        help="Stockfish's search depth per move (default: 10; only with --opponent stockfish)")
    parser.add_argument("--games", type=int, default=10, help="games to play (default: 10)")
    parser.add_argument("--max-plies", type=int, default=MAX_PLIES,
                        help=f"plies after which a running game is adjudicated, or in self-play left unfinished "
                             f"(default: {MAX_PLIES})")
    parser.add_argument("--adjudicate", type=finite_float, default=ADJUDICATE_PAWNS, metavar="PAWNS",
                        help="a game at the ply limit is won by the side Stockfish's eval of the final position "
                             f"puts ahead by at least this many pawns, else drawn (0: always drawn; default: "
                             f"{ADJUDICATE_PAWNS:g})")
    parser.add_argument("--opening-plies", type=int, default=None, metavar="K",
                        help="each game starts after K uniformly random plies from a seeded stream of its own "
                             f"(default: 0; with --opponent self or model, {GREEDY_OPENING_PLIES})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random mover, the openings, the model's fallback moves and --votes' samples "
                             "(default: 0)")
    parser.add_argument("--fallback", choices=FALLBACKS, default="random",
                        help="what replaces the model's illegal or missing B: move: a random legal move, or listed: "
                             "its legal M: candidate with the highest E: eval, as rookworld uci plays (a random "
                             "one when none is legal); counted as illegal either way (default: random)")
    add_repetition_argument(parser)
    add_votes_argument(parser)
    add_readout_argument(parser)
    parser.add_argument("--opponent-fallback", choices=FALLBACKS, default=None,
                        help="--fallback for the opponent of --opponent model (default: random)")
    add_repetition_argument(parser, flag="--opponent-avoid-repetition",
                            help="--avoid-repetition for the opponent of --opponent model (default: off)")
    parser.add_argument("--opponent-votes", type=int, default=None, metavar="K",
                        help="--votes for the opponent of --opponent model (default: 1, greedy)")
    parser.add_argument("--opponent-readout", choices=READOUTS, default=None,
                        help="--readout for the opponent of --opponent model (default: b)")
    parser.add_argument("--world", choices=WORLDS, default="rules",
                        help="what each move does: rules, python-chess's; model, the model's own greedy A completion "
                             "for FEN+move+history, the game going on from the states it writes, each transition "
                             "checked by the arbiter: the JSON adds the plies to the first divergence and A/exact "
                             "along the games (default: rules)")
    parser.add_argument("--pgn", help="write the games to this PGN file")
    parser.add_argument("--out", help="write the results to this JSON file")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads and Stockfish processes for judging (default: every core)")


class RandomMover:
    """Uniformly random legal moves from a seeded stream (`SEED/STREAM`: the opponent's, or a game's opening)."""

    name = "random"

    def __init__(self, seed: int, stream: str = "opponent") -> None:
        self.rng = random.Random(f"{seed}/{stream}")

    def play(self, board: chess.Board) -> chess.Move:
        return self.rng.choice(list(board.legal_moves))

    def close(self) -> None:
        pass


@dataclass
class ModelOpponent:
    """A second model (a `ModelPlayer`) as the opponent: its greedy `B:` moves, a random legal move where one is
    illegal or missing; its moves are recorded and judged as the model's are."""

    player: ModelPlayer
    name: str

    def close(self) -> None:
        pass


@dataclass
class Game:
    """One game in progress; `model_moves` holds (FEN, UCI or None when illegal or missing) per model move,
    `opponent_moves` the same for a model opponent's moves. `model_color` None: the model plays both sides
    (self-play)."""

    index: int
    model_color: chess.Color | None
    board: chess.Board = field(default_factory=chess.Board)
    model_moves: list[tuple[str, str | None]] = field(default_factory=list)
    opponent_moves: list[tuple[str, str | None]] = field(default_factory=list)
    outcome: chess.Outcome | None = None
    termination: str | None = None
    final_eval: float | None = None  # pawns, the model's view: Stockfish's eval of a position at the ply limit
    repetitions_avoided: int = 0  # the model's `B:` moves set aside for repeating a position
    opponent_repetitions_avoided: int = 0  # a model opponent's
    world: Line | None = None  # in the model's world: the game's course there (`board` is then the model's state)

    def take(self, choice, record: list[tuple[str, str | None]], self_play: bool) -> None:
        """Plays a model's `choice` (player.Choice) and appends it to `record`: the position and the model's own
        move, None where it was not (illegal or missing). A move not its own is the fallback's, in self-play none:
        the game is forfeited; but in the model's world the `B:` move as written goes to the world whenever it is
        a UCI move, legal or not (the world judges it)."""
        record.append((self.board.fen(), choice.move.uci() if choice.own else None))
        move = choice.move if choice.own else written(choice) if self.world is not None else None
        if move is None and not self_play:
            move = choice.move  # the fallback's
        if move is None:
            self.forfeit()
        else:
            self.play(move)

    def play(self, move: chess.Move) -> None:
        """Pushes `move` (the rules' world), or holds it for the model's world (`step_world`)."""
        if self.world is None:
            self.push(move)
        else:
            self.world.pending = move

    def uci_moves(self) -> list[str]:
        """The moves of the game, the opening included."""
        return self.world.moves if self.world is not None else [move.uci() for move in self.board.move_stack]

    def model_to_move(self) -> bool:
        return self.model_color is None or self.board.turn == self.model_color

    def push(self, move: chess.Move) -> None:
        self.board.push(move)
        self.end(ended(self.board))

    def end(self, outcome: chess.Outcome | None) -> None:
        """Ends the game by a rule's `outcome` (None: it goes on), the termination named after the rule."""
        self.outcome = outcome
        if outcome is not None:
            self.termination = outcome.termination.name.lower().replace("_", " ")

    def forfeit(self) -> None:
        """Self-play's end at an illegal or missing move: the side to move loses (VARIANT_LOSS stands in for
        python-chess's missing forfeit ending)."""
        self.outcome = chess.Outcome(chess.Termination.VARIANT_LOSS, not self.board.turn)
        self.termination = ILLEGAL

    def open(self, plies: int, mover: RandomMover) -> None:
        """Plays up to `plies` moves of `mover` (fewer if the game ends)."""
        for _ in range(plies):
            if self.outcome is not None:
                break
            self.push(mover.play(self.board))

    def legal_half_moves(self) -> int:
        return sum(uci is not None for _, uci in self.model_moves)

    def adjudicate(self, model_eval: float | None, pawns: float) -> None:
        """A game past the ply limit: won by the side `model_eval` (the model's view, None: not judged) puts at
        least `pawns` ahead, else drawn (python-chess has no adjudication ending: VARIANT_WIN and VARIANT_DRAW
        stand in for it in `outcome`, `termination` names it)."""
        self.final_eval, self.termination = model_eval, PLY_LIMIT
        if model_eval is not None and pawns > 0 and abs(model_eval) >= pawns:
            winner = self.model_color if model_eval > 0 else not self.model_color
            self.outcome = chess.Outcome(chess.Termination.VARIANT_WIN, winner)
        else:
            self.outcome = chess.Outcome(chess.Termination.VARIANT_DRAW, None)

    @property
    def model_result(self) -> str:
        winner = self.outcome.winner
        return "draw" if winner is None else "win" if winner == self.model_color else "loss"


def ended(board: chess.Board) -> chess.Outcome | None:
    """The automatic game ends, plus threefold repetition and the fifty-move rule claimed at once (python-chess's
    own claim_draw also ends a game when a move *could* repeat the position thrice, which no one claimed)."""
    outcome = board.outcome(claim_draw=False)
    if outcome is None and board.is_repetition(3):
        outcome = chess.Outcome(chess.Termination.THREEFOLD_REPETITION, None)
    if outcome is None and board.is_fifty_moves():
        outcome = chess.Outcome(chess.Termination.FIFTY_MOVES, None)
    return outcome


def written(choice) -> chess.Move | None:
    """The `B:` move of a choice's completion as written, when it is a UCI move (legal or not; not the null move)."""
    best = parse_p_completion(choice.completion).best
    if best is None or not is_uci_shaped(best):
        return None
    try:
        return chess.Move.from_uci(best)
    except ValueError:  # a move to its own square (a1a1)
        return None


def step_world(world: World, games: list[Game]) -> None:
    """Sends the moves the games hold to the model's world in one batched generation, records each transition
    with its divergence, and goes on from the model's state or ends the game as the world says (world.after); a
    state standing a third time, or a halfmove clock of 100, ends it as the rules' world claims those draws."""
    moving = [game for game in games if game.world.pending is not None]
    if not moving:
        return
    requests = [(g.board.fen(), g.world.pending.uci(), [*g.world.moves, g.world.pending.uci()]) for g in moving]
    for game, (fen, move, _), (completion, truth) in zip(moving, requests, world.transitions(requests)):
        line = game.world
        line.pending = None
        line.moves.append(move)
        line.steps.append(Step(fen, move, completion, truth, divergence(truth, completion)))
        board, outcome, termination = after(completion, game.board.turn)
        if board is None:
            game.outcome, game.termination = outcome, termination
            continue
        game.board = board
        if line.stands(board) >= 3:
            game.end(chess.Outcome(chess.Termination.THREEFOLD_REPETITION, None))
        elif board.halfmove_clock >= 100:
            game.end(chess.Outcome(chess.Termination.FIFTY_MOVES, None))


def play_games(player, opponent, games: int, max_plies: int, progress=None, opening_plies: int = 0,
               seed: int = 0, world: World | None = None) -> list[Game]:
    """`games` games in lockstep, one ply of every running game per round, each after `opening_plies` random
    plies from the stream `seed/opening/k`: k = i for self-play game i; against an opponent k = i // 2, the
    model white in game 2k and black in 2k + 1. `opponent` None: self-play, where a game stops at the
    model's first illegal move. Games still running after `max_plies` plies are left without an outcome: for
    `adjudicate` against an opponent, unfinished (`SELF_PLY_LIMIT`) in self-play. With `world` the moves after
    the opening are played in the model's world (`step_world`: one batched A generation a ply)."""
    played = [Game(i, None if opponent is None else chess.WHITE if i % 2 == 0 else chess.BLACK)
              for i in range(games)]
    for game in played:
        opening = game.index if opponent is None else game.index // 2
        game.open(opening_plies, RandomMover(seed, f"opening/{opening}"))
        if world is not None:
            game.world = Line(moves=game.uci_moves())
            game.world.stands(game.board)
    for ply in range(opening_plies + 1, max_plies + 1):
        running = [g for g in played if g.outcome is None]
        if not running:
            break
        model_turn = [g for g in running if g.model_to_move()]
        opponent_turn = [g for g in running if not g.model_to_move()]
        for game, choice in zip(model_turn, player.choose([g.board for g in model_turn])):
            game.repetitions_avoided += choice.avoided is not None
            game.take(choice, game.model_moves, opponent is None)
        if isinstance(opponent, ModelOpponent):  # one batched generation, as the model's
            for game, choice in zip(opponent_turn, opponent.player.choose([g.board for g in opponent_turn])):
                game.opponent_repetitions_avoided += choice.avoided is not None
                game.take(choice, game.opponent_moves, False)
        else:
            for game in opponent_turn:
                game.play(opponent.play(game.board))
        if world is not None:
            step_world(world, running)
        if progress is not None:
            progress.update(ply, {"running": sum(g.outcome is None for g in played)})
    if opponent is None:  # self-play has no side to adjudicate for: a game at the limit stays unfinished
        for game in played:
            if game.outcome is None:
                game.termination = SELF_PLY_LIMIT
    return played


def per_game_values(played: list[Game]) -> list[dict[str, list[float]]]:
    """Per self-play game, the metrics `rookworld eval --self-play` reports: its legal half-moves and whether
    an illegal move ended it (metrics.summarize's per-prompt form, one game a prompt)."""
    return [{"selfplay/legal_half_moves": [float(game.legal_half_moves())],
             "selfplay/ended_illegal": [float(game.termination == ILLEGAL)]} for game in played]


def adjudicate(played: list[Game], pool, pawns: float) -> None:
    """Decides the games still running by Stockfish's eval of their final positions at the P labels' limit
    (`pool`, a StockfishPool; not used when `pawns` is 0: every such game is drawn)."""
    from rookworld.stockfish import LABEL_LIMIT

    running = [g for g in played if g.outcome is None]
    evals: list[float | None] = [None] * len(running)
    if pawns > 0:
        analyses = pool.analyse([g.board.fen() for g in running], LABEL_LIMIT, multipv=1)
        # an analysis speaks for the side to move
        evals = [a.evals[0] if g.model_to_move() else -a.evals[0] for g, a in zip(running, analyses)]
    for game, model_eval in zip(running, evals):
        game.adjudicate(model_eval, pawns)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mates_missed(game: Game) -> tuple[int, int]:
    """The model's turns in `game` with a mate in one, and how many of them it did not mate in (an illegal
    or missing move misses)."""
    chances = missed = 0
    for fen, uci in game.model_moves:
        mates = mating_moves(chess.Board(fen))
        chances += bool(mates)
        missed += bool(mates) and uci not in mates
    return chances, missed


def _color(game: Game) -> str:
    return "both" if game.model_color is None else "white" if game.model_color == chess.WHITE else "black"


def elo_difference(score: float) -> float | None:
    """The Elo difference that expects `score` (points a game): the logistic curve on which 400 points
    multiply the odds by 10; None at 0 or 1, where no finite difference does."""
    return 400 * math.log10(score / (1 - score)) if 0 < score < 1 else None


def elo_interval(score: Estimate) -> list[float | None] | None:
    """The 95% interval of the Elo difference, from the score's normal interval (score ± 1.96 SE): a bound
    beyond a score of 0 or 1 is None (unbounded); None without an SE (one game). At a score of 0 or 1 (every
    game lost or won: an SE of 0) the finite bound is exact instead: the score p at which n units (games, or
    pairs of games) scoring in [0, 1] all score 0 with probability at most (1 - p)^n = 2.5% (all 1 likewise).
    None too where every unit scored the same in between (all drawn, every pair split): an SE of 0 that is no
    certainty, and no exact bound to put in its place."""
    if math.isnan(score.se):
        return None
    if score.mean in (0.0, 1.0):
        edge = 1 - 0.025 ** (1 / score.n)
        return [None, elo_difference(edge)] if score.mean == 0.0 else [elo_difference(1 - edge), None]
    if score.se == 0.0:
        return None
    return [elo_difference(score.mean + side * 1.96 * score.se) for side in (-1, 1)]


def _result(game: Game) -> str:
    return "*" if game.outcome is None else game.outcome.result()


def _by_game(moves: list[list[tuple[str, str | None]]], losses: list[float]) -> list[list[float]]:
    """`losses`, judged game by game in order, cut into each game's share of `moves`."""
    cut, at = [], 0
    for game_moves in moves:
        cut.append(losses[at:at + len(game_moves)])
        at += len(game_moves)
    return cut


def move_quality(moves: list[tuple[str, str | None]], losses: list[float]) -> dict:
    """The moves' (FEN, UCI or None: illegal or missing) mean loss in pawns, over the legal ones, and the illegal
    count and share, from their `losses` (an illegal move's is the cap)."""
    illegal = sum(uci is None for _, uci in moves)
    legal = [loss for (_, uci), loss in zip(moves, losses) if uci is not None]
    return {"acpl": _mean(losses), "acpl_legal": _mean(legal), "illegal_rate": illegal / len(moves) if moves else 0.0,
            "illegal_moves": illegal}


def summary(played: list[Game], losses: list[float], paired: bool = False,
            opponent_losses: list[float] | None = None) -> dict:
    """Totals and per-game results; `losses` are the model's move losses in pawns, game by game in order, and
    `opponent_losses` a model opponent's (None: not judged). Games against an opponent are scored in points, the
    SE clustered by pairs of games when `paired` (games 2k and 2k + 1 share an opening); self-play games (all or
    none) by their legal half-moves."""
    self_play = any(game.model_color is None for game in played)
    theirs = None if opponent_losses is None else _by_game([g.opponent_moves for g in played], opponent_losses)
    per_game = []
    for i, (game, mine) in enumerate(zip(played, _by_game([g.model_moves for g in played], losses))):
        chances, missed = mates_missed(game)
        quality = move_quality(game.model_moves, mine)
        record = {"index": game.index, "model_color": _color(game), "result": _result(game),
                  "termination": game.termination, "plies": len(game.uci_moves()), "model_moves": len(mine),
                  "illegal_moves": quality["illegal_moves"], "acpl": quality["acpl"],
                  "mate_chances": chances, "mates_missed": missed, "repetitions_avoided": game.repetitions_avoided}
        if self_play:
            record["legal_half_moves"] = game.legal_half_moves()
        else:
            record.update(model_result=game.model_result, final_eval=game.final_eval)
        if theirs is not None:
            quality = move_quality(game.opponent_moves, theirs[i])
            record.update(opponent_moves=len(theirs[i]), opponent_acpl=quality["acpl"],
                          opponent_illegal_moves=quality["illegal_moves"],
                          opponent_repetitions_avoided=game.opponent_repetitions_avoided)
        if game.world is not None:
            record["world"] = game.world.record()
        per_game.append({**record, "moves": game.uci_moves()})
    model_moves = [move for game in played for move in game.model_moves]
    chances = sum(g["mate_chances"] for g in per_game)
    totals = {"games": len(played)}
    if self_play:
        halves = estimate([[g["legal_half_moves"]] for g in per_game])  # each game its own cluster
        ends = [g["termination"] for g in per_game]
        by_world = sum(end in ENDS for end in ends)
        totals.update(legal_half_moves=halves.mean, legal_half_moves_se=json_se(halves),
                      legal_half_moves_median=statistics.median(g["legal_half_moves"] for g in per_game),
                      ended_illegal=ends.count(ILLEGAL), at_ply_limit=ends.count(SELF_PLY_LIMIT),
                      ended_by_rules=len(ends) - ends.count(ILLEGAL) - ends.count(SELF_PLY_LIMIT) - by_world)
        if played[0].world is not None:
            totals["ended_by_world"] = by_world
    else:
        counts = {kind: sum(g["model_result"] == kind for g in per_game) for kind in ("win", "draw", "loss")}
        points = [POINTS[g["model_result"]] for g in per_game]
        score = estimate([points[i:i + 2] for i in range(0, len(points), 2)] if paired else [[p] for p in points])
        totals.update(wins=counts["win"], draws=counts["draw"], losses=counts["loss"], score=score.mean,
                      score_se=json_se(score), elo=elo_difference(score.mean), elo_interval=elo_interval(score),
                      adjudicated=sum(g.termination == PLY_LIMIT for g in played))
    if played and played[0].world is not None:
        totals["world"] = world_summary([game.world for game in played])
    if opponent_losses is not None:
        opponent_moves = [move for game in played for move in game.opponent_moves]
        totals.update(opponent_moves=len(opponent_moves),
                      **{f"opponent_{k}": v for k, v in move_quality(opponent_moves, opponent_losses).items()},
                      opponent_repetitions_avoided=sum(g.opponent_repetitions_avoided for g in played))
    return {**totals, **move_quality(model_moves, losses), "mate_chances": chances,
            "mate_in_one": 1.0 - sum(g["mates_missed"] for g in per_game) / chances if chances else None,
            "repetitions_avoided": sum(g["repetitions_avoided"] for g in per_game),
            "plies": sum(g["plies"] for g in per_game), "model_moves": len(model_moves), "per_game": per_game}


def _share(rate: float | None, n: int) -> str:
    return f"{rate:.2f} of {n} chances" if rate is not None else "never on the board"


def write_pgn(path: str, played: list[Game], model_name: str, opponent_name: str) -> None:
    import chess.pgn

    date = time.strftime("%Y.%m.%d")
    with open(path, "w", encoding="utf-8") as handle:
        for game in played:
            names = (model_name, opponent_name) if game.model_color != chess.BLACK else (opponent_name, model_name)
            pgn = chess.pgn.Game.from_board(game.board) if game.world is None else _world_pgn(game.world)
            pgn.headers.update(Event="rookworld play", Site="?", Date=date, Round=str(game.index + 1),
                               White=names[0], Black=names[1], Result=_result(game), Termination=game.termination)
            print(pgn, file=handle, end="\n\n")


def _world_pgn(line: Line):
    """A game of the model's world as the rules see it: its moves up to the first divergence, the move that diverged
    included when it is legal (the states agree with the rules' until then), with the divergence and the world's
    course after it in a comment on the last move."""
    import chess.pgn

    first = line.first()
    board = chess.Board()
    for uci in line.moves[:len(line.moves) - len(line.steps) + (len(line.steps) if first is None else first + 1)]:
        move = chess.Move.from_uci(uci)
        if not board.is_legal(move):
            break
        board.push(move)
    pgn = chess.pgn.Game.from_board(board)
    pgn.end().comment = describe(line)
    return pgn


def _opponent(args: argparse.Namespace):
    """The opponent the flags ask for (None: self-play); checks them before the model is loaded."""
    if args.opponent not in OPPONENTS:
        raise UserError(f"--opponent {args.opponent}: unknown; use one of {', '.join(OPPONENTS)}")
    if args.opponent_model is not None and args.opponent != "model":
        raise UserError(f"--opponent-model {args.opponent_model}: names the opponent of --opponent model; add "
                        "--opponent model or drop it")
    for flag, value in (("--opponent-avoid-repetition", args.opponent_avoid_repetition),
                        ("--opponent-fallback", args.opponent_fallback),
                        ("--opponent-votes", args.opponent_votes), ("--opponent-readout", args.opponent_readout)):
        if value is not None and args.opponent != "model":
            shown = f"{value:g}" if isinstance(value, float) else value
            raise UserError(f"{flag} {shown}: sets the opponent of --opponent model; add --opponent model or drop it")
    for flag, value in (("--avoid-repetition", args.avoid_repetition),
                        ("--opponent-avoid-repetition", args.opponent_avoid_repetition)):
        if value is not None and args.world == "model":
            raise UserError(f"{flag} {value:g}: the model's world has no game history to see a repetition in; drop "
                            "it or use --world rules")
    if args.fallback != "random" and args.opponent == "self":
        raise UserError(f"--fallback {args.fallback}: self-play stops at the model's first illegal move, so nothing "
                        "replaces it; drop the flag")
    if args.opponent != "stockfish":
        if args.skill is not None or args.depth is not None:
            raise UserError("--skill and --depth set Stockfish; use them with --opponent stockfish")
        if args.opponent == "model":
            player = ModelPlayer.load(args.opponent_model, threads=args.threads, seed=args.seed,
                                      stream="opponent-fallback", avoid_repetition=args.opponent_avoid_repetition,
                                      fallback=args.opponent_fallback or "random", votes=args.opponent_votes or 1,
                                      readout=args.opponent_readout or "b")
            return ModelOpponent(player, args.opponent_model or EMBEDDED_NAME)
        return RandomMover(args.seed) if args.opponent == "random" else None
    from rookworld.stockfish import PLAY_LIMIT, Limit, SkillEngine

    if args.depth is not None and args.depth < 1:
        raise UserError(f"--depth {args.depth}: Stockfish's search depth must be >= 1")
    return SkillEngine(0 if args.skill is None else args.skill,
                       PLAY_LIMIT if args.depth is None else Limit(depth=args.depth))


def _opening_plies(args: argparse.Namespace) -> int:
    """--opening-plies, its default by opponent, and its checks."""
    greedy = args.opponent in ("self", "model")  # greedy models on both sides: one start, one game
    plies = args.opening_plies if args.opening_plies is not None else GREEDY_OPENING_PLIES if greedy else 0
    if plies < 0 or plies >= args.max_plies:
        raise UserError(f"--opening-plies {plies}: must be >= 0 and below --max-plies ({args.max_plies})")
    distinct = 1 if args.opponent == "self" else 2  # against a model: one game with each colour
    if greedy and plies == 0 and args.games > distinct:
        raise UserError(f"--opening-plies 0 with --opponent {args.opponent} and --games {args.games}: greedy games "
                        f"from one start repeat; use --games {distinct} or --opening-plies >= 1")
    return plies


def _avoided(pawns: float | None, count: int) -> str:
    return "" if pawns is None else f", {count} repetitions avoided"


def _pawns(acpl: float | None) -> str:
    return "n/a" if acpl is None else f"{acpl:.2f} pawns"  # None: the player never moved


def _report(name: str, opponent_name: str, results: dict) -> str:
    settings = results["settings"]
    moves = (f"acpl {_pawns(results['acpl'])}, illegal rate {results['illegal_rate']:.3f}, mate in one "
             f"{_share(results['mate_in_one'], results['mate_chances'])}"
             f"{_avoided(settings['avoid_repetition'], results['repetitions_avoided'])}, {results['plies']} plies in "
             f"{results['wall_s']:.0f} s")
    if "world" in results:
        moves += "; " + world_text(results["world"], results["games"])
    if settings["opponent"] == "self":
        by_world = f"{results['ended_by_world']} by the model's world, " if "ended_by_world" in results else ""
        return (f"{name} vs itself: {results['games']} games, legal half-moves {results['legal_half_moves']:.1f} ± "
                f"{results['legal_half_moves_se'] or 0:.1f} (median {results['legal_half_moves_median']:g}); "
                f"{results['ended_illegal']} ended by an illegal move, {results['ended_by_rules']} by the rules, "
                f"{by_world}{results['at_ply_limit']} at the ply limit; {moves}")
    opponent_moves = (f"; the opponent's acpl {_pawns(results['opponent_acpl'])}, illegal rate "
                      f"{results['opponent_illegal_rate']:.3f}"
                      f"{_avoided(settings['opponent_avoid_repetition'], results['opponent_repetitions_avoided'])}"
                      if "opponent_acpl" in results else "")
    return (f"{name} vs {opponent_name}: {results['games']} games, +{results['wins']} ={results['draws']} "
            f"-{results['losses']} ({results['adjudicated']} adjudicated), score {results['score']:.3f} ± "
            f"{results['score_se'] or 0:.3f}, Elo {elo_text(results)}, "
            f"{moves}{opponent_moves}")


def world_text(world: dict, games: int) -> str:
    """The model's world's totals (world.summary) as the report line writes them."""
    kinds = ", ".join(f"{kind} {n}" for kind, n in world["first_divergences"].items() if n) or "none"
    exact = "n/a" if world["a_exact"] is None else f"{world['a_exact']:.3f}"
    return (f"in the model's world: plies to the first divergence {world['plies_to_divergence']:.1f} ± "
            f"{world['plies_to_divergence_se'] or 0:.1f} ({world['censored']} of {games} games without one, counted "
            f"at their length), A/exact {exact} over {world['transitions']} transitions; first divergences: {kinds}")


def elo_text(results: dict) -> str:
    """The Elo difference of a `summary` and its interval, as the report line writes them."""
    def signed(value: float | None, unbounded: str) -> str:
        return unbounded if value is None else f"{value:+.0f}"
    text = signed(results["elo"], "+inf" if results["score"] == 1 else "-inf")  # no finite difference at 0 or 1
    if results["elo_interval"] is not None:  # an unbounded end is the low one below, the high one above
        low, high = results["elo_interval"]
        text += f" (95%: {signed(low, '-inf')} to {signed(high, '+inf')})"
    elif results["score_se"] == 0.0:  # not one game: every game (pair) scored the same, short of a sweep
        text += " (no 95% interval: every game or pair scored the same)"
    return text


def run(args: argparse.Namespace) -> int:
    from rookworld.log import Progress
    from rookworld.quality import judge_moves
    from rookworld.stockfish import LABEL_LIMIT, StockfishPool

    for flag, value in (("--games", args.games), ("--max-plies", args.max_plies), ("--threads", args.threads),
                        ("--votes", args.votes), ("--opponent-votes", args.opponent_votes)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: must be >= 1")
    if args.adjudicate < 0:
        raise UserError(f"--adjudicate {args.adjudicate:g}: pawns must be >= 0 (0: games at the ply limit are drawn)")
    for flag, path in (("--pgn", args.pgn), ("--out", args.out)):  # written once every game is played and judged
        if path:
            output_file(Path(path), flag)
    started = time.perf_counter()
    opening_plies = _opening_plies(args)
    opponent = _opponent(args)
    opponent_name = "self" if opponent is None else opponent.name
    try:
        player = ModelPlayer.load(args.model, threads=args.threads, seed=args.seed,
                                  avoid_repetition=args.avoid_repetition, fallback=args.fallback, votes=args.votes,
                                  readout=args.readout)
        with Progress(args.max_plies, description="play", fields={"running": "games running"}) as progress:
            world = World(player.model, player.tokenizer) if args.world == "model" else None
            played = play_games(player, opponent, args.games, args.max_plies, progress, opening_plies, args.seed,
                                world)
    finally:
        if opponent is not None:
            opponent.close()
    play_s = time.perf_counter() - started
    moves = [move for game in played for move in game.model_moves]
    theirs = [move for game in played for move in game.opponent_moves]  # a model opponent's
    print(f"judging the {len(moves) + len(theirs)} model moves with Stockfish at {LABEL_LIMIT.key()}", flush=True)
    with StockfishPool(processes=args.threads) as pool:
        if opponent is not None:
            adjudicate(played, pool, args.adjudicate)
        losses = [quality.loss for quality in judge_moves(pool, moves + theirs)]
    model_name = args.model or EMBEDDED_NAME
    engine = opponent if args.opponent == "stockfish" else None
    results = {"settings": {"model": model_name, "opponent": args.opponent, "skill": engine and engine.skill,
                            "depth": engine and engine.limit.depth,
                            "opponent_model": opponent.name if isinstance(opponent, ModelOpponent) else None,
                            "seed": args.seed, "max_plies": args.max_plies,
                            "opening_plies": opening_plies,
                            "adjudicate": None if opponent is None else args.adjudicate,
                            "fallback": args.fallback, "avoid_repetition": args.avoid_repetition,
                            "opponent_fallback": opponent.player.fallback if isinstance(opponent, ModelOpponent)
                            else None,
                            "opponent_avoid_repetition": args.opponent_avoid_repetition, "votes": args.votes,
                            "opponent_votes": opponent.player.votes if isinstance(opponent, ModelOpponent) else None,
                            "readout": args.readout,
                            "opponent_readout": opponent.player.readout if isinstance(opponent, ModelOpponent)
                            else None,
                            "world": args.world, "judge_limit": LABEL_LIMIT.key()},
               **summary(played, losses[:len(moves)], opening_plies > 0,
                         losses[len(moves):] if isinstance(opponent, ModelOpponent) else None),
               "play_s": play_s, "wall_s": time.perf_counter() - started}
    print(_report(model_name, opponent_name, results))
    if args.pgn:
        write_pgn(args.pgn, played, model_name, model_name if opponent is None else opponent.name)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0
