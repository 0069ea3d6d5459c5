"""`rookworld play --opponent random|stockfish [--skill N] [--games N] [--out FILE.json] [--pgn FILE]`

Games of a model (its greedy `B:` move, see player.py) against a seeded random mover or Stockfish at
a skill level. The model is white in the even games. All games advance in lockstep, so each ply is one
batched generation for every game where the model is to move.

Games end by python-chess's rules; threefold repetition and the fifty-move rule end them as soon as
they hold (the draw is claimed). A game still running after --max-plies is adjudicated by Stockfish's
eval of its final position at the P labels' limit: won by the side ahead by at least --adjudicate
pawns, else drawn (a model that wins material from a random mover but cannot mate would otherwise
draw every game). The model's moves are then judged by Stockfish at the same limit (quality.py):
`acpl` is their mean loss in pawns, an illegal or missing move counting as the cap. `mate_in_one` is
the share of the model's turns with a mate in one (`mate_chances`) where its own move mated: the depth-10
loss cannot see a missed mate when the other move keeps a won position (both evals clip to 10 pawns).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import chess

from rookworld.data.cases import mating_moves
from rookworld.errors import UserError
from rookworld.metrics import estimate

OPPONENTS = ("random", "stockfish")
PLY_LIMIT = "ply limit adjudication"
POINTS = {"win": 1.0, "draw": 0.5, "loss": 0.0}
ADJUDICATE_PAWNS = 5.0  # a rook and more: decisive, and beyond the noise of a depth-10 eval


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint directory or hub id (default: the embedded model)")
    parser.add_argument("--opponent", required=True, help="random (uniform legal moves) or stockfish")
    parser.add_argument("--skill", type=int, default=None,
                        help="Stockfish's UCI Skill Level, 0..20 (default: 0; only with --opponent stockfish)")
    parser.add_argument("--depth", type=int, default=None,
                        help="Stockfish's search depth per move (default: 10; only with --opponent stockfish)")
    parser.add_argument("--games", type=int, default=10, help="games to play (default: 10)")
    parser.add_argument("--max-plies", type=int, default=200,
                        help="plies after which a running game is adjudicated (default: 200)")
    parser.add_argument("--adjudicate", type=float, default=ADJUDICATE_PAWNS, metavar="PAWNS",
                        help="a game at the ply limit is won by the side Stockfish's eval of the final position "
                             f"puts ahead by at least this many pawns, else drawn (0: always drawn; default: "
                             f"{ADJUDICATE_PAWNS:g})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random mover and of the model's fallback moves (default: 0)")
    parser.add_argument("--pgn", help="write the games to this PGN file")
    parser.add_argument("--out", help="write the results to this JSON file")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads and Stockfish processes for judging (default: every core)")


class RandomMover:
    """Uniformly random legal moves from a seeded stream."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"{seed}/opponent")

    def play(self, board: chess.Board) -> chess.Move:
        return self.rng.choice(list(board.legal_moves))

    def close(self) -> None:
        pass


@dataclass
class Game:
    """One game in progress; `model_moves` holds (FEN, UCI or None when illegal or missing) per model move."""

    index: int
    model_color: chess.Color
    board: chess.Board = field(default_factory=chess.Board)
    model_moves: list[tuple[str, str | None]] = field(default_factory=list)
    outcome: chess.Outcome | None = None
    termination: str | None = None
    final_eval: float | None = None  # pawns, the model's view: Stockfish's eval of a position at the ply limit

    def model_to_move(self) -> bool:
        return self.board.turn == self.model_color

    def push(self, move: chess.Move) -> None:
        self.board.push(move)
        self.outcome = ended(self.board)
        if self.outcome is not None:
            self.termination = self.outcome.termination.name.lower().replace("_", " ")

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


def play_games(player, opponent, games: int, max_plies: int, progress=None) -> list[Game]:
    """`games` games in lockstep, one ply of every running game per round; those still running after
    `max_plies` are left without an outcome, for `adjudicate`."""
    played = [Game(i, chess.WHITE if i % 2 == 0 else chess.BLACK) for i in range(games)]
    for ply in range(1, max_plies + 1):
        running = [g for g in played if g.outcome is None]
        if not running:
            break
        model_turn = [g for g in running if g.model_to_move()]
        opponent_turn = [g for g in running if not g.model_to_move()]
        for game, choice in zip(model_turn, player.choose([g.board for g in model_turn])):
            game.model_moves.append((game.board.fen(), choice.move.uci() if choice.own else None))
            game.push(choice.move)
        for game in opponent_turn:
            game.push(opponent.play(game.board))
        if progress is not None:
            progress.update(ply, {"running": sum(g.outcome is None for g in played)})
    return played


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


def summary(played: list[Game], losses: list[float]) -> dict:
    """Totals and per-game results; `losses` are the model's move losses in pawns, game by game in order."""
    per_game, at = [], 0
    for game in played:
        mine = losses[at:at + len(game.model_moves)]
        at += len(mine)
        chances, missed = mates_missed(game)
        per_game.append({
            "index": game.index, "model_color": "white" if game.model_color == chess.WHITE else "black",
            "result": game.outcome.result(), "model_result": game.model_result, "termination": game.termination,
            "plies": game.board.ply(), "model_moves": len(mine),
            "illegal_moves": sum(uci is None for _, uci in game.model_moves),
            "acpl": _mean(mine), "mate_chances": chances, "mates_missed": missed, "final_eval": game.final_eval,
            "moves": [move.uci() for move in game.board.move_stack]})
    counts = {kind: sum(g["model_result"] == kind for g in per_game) for kind in ("win", "draw", "loss")}
    moves = sum(g["model_moves"] for g in per_game)
    illegal = sum(g["illegal_moves"] for g in per_game)
    legal = [loss for (_, uci), loss in zip((m for g in played for m in g.model_moves), losses) if uci is not None]
    score = estimate([[POINTS[g["model_result"]]] for g in per_game])  # each game its own cluster
    chances = sum(g["mate_chances"] for g in per_game)
    return {"games": len(played), "wins": counts["win"], "draws": counts["draw"], "losses": counts["loss"],
            "score": score.mean, "score_se": None if math.isnan(score.se) else score.se,
            "adjudicated": sum(g.termination == PLY_LIMIT for g in played),
            "acpl": _mean(losses), "acpl_legal": _mean(legal),
            "illegal_rate": illegal / moves if moves else 0.0, "mate_chances": chances,
            "mate_in_one": 1.0 - sum(g["mates_missed"] for g in per_game) / chances if chances else None,
            "plies": sum(g["plies"] for g in per_game), "model_moves": moves, "illegal_moves": illegal,
            "per_game": per_game}


def _share(rate: float | None, n: int) -> str:
    return f"{rate:.2f} of {n} chances" if rate is not None else "never on the board"


def write_pgn(path: str, played: list[Game], model_name: str, opponent_name: str) -> None:
    import chess.pgn

    date = time.strftime("%Y.%m.%d")
    with open(path, "w", encoding="utf-8") as handle:
        for game in played:
            names = (model_name, opponent_name) if game.model_color == chess.WHITE else (opponent_name, model_name)
            pgn = chess.pgn.Game.from_board(game.board)
            pgn.headers.update(Event="rookworld play", Site="?", Date=date, Round=str(game.index + 1),
                               White=names[0], Black=names[1], Result=game.outcome.result(),
                               Termination=game.termination)
            print(pgn, file=handle, end="\n\n")


def _opponent(args: argparse.Namespace):
    """The opponent the flags ask for; checks them before the model is loaded."""
    if args.opponent not in OPPONENTS:
        raise UserError(f"--opponent {args.opponent}: unknown; use one of {', '.join(OPPONENTS)}")
    if args.opponent == "random":
        if args.skill is not None or args.depth is not None:
            raise UserError("--skill and --depth set Stockfish; use them with --opponent stockfish")
        return RandomMover(args.seed)
    from rookworld.stockfish import PLAY_LIMIT, Limit, SkillEngine

    if args.depth is not None and args.depth < 1:
        raise UserError(f"--depth {args.depth}: Stockfish's search depth must be >= 1")
    return SkillEngine(0 if args.skill is None else args.skill,
                       PLAY_LIMIT if args.depth is None else Limit(depth=args.depth))


def run(args: argparse.Namespace) -> int:
    from rookworld.log import Progress
    from rookworld.player import ModelPlayer
    from rookworld.quality import judge_moves
    from rookworld.stockfish import LABEL_LIMIT, StockfishPool

    for flag, value in (("--games", args.games), ("--max-plies", args.max_plies), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UserError(f"{flag} {value}: must be >= 1")
    if args.adjudicate < 0:
        raise UserError(f"--adjudicate {args.adjudicate:g}: pawns must be >= 0 (0: games at the ply limit are drawn)")
    started = time.perf_counter()
    opponent = _opponent(args)
    try:
        player = ModelPlayer.load(args.model, threads=args.threads, seed=args.seed)
        with Progress(args.max_plies, description="play", fields={"running": "games running"}) as progress:
            played = play_games(player, opponent, args.games, args.max_plies, progress)
    finally:
        opponent.close()
    play_s = time.perf_counter() - started
    moves = [move for game in played for move in game.model_moves]
    print(f"judging the model's {len(moves)} moves with Stockfish at {LABEL_LIMIT.key()}", flush=True)
    with StockfishPool(processes=args.threads) as pool:
        adjudicate(played, pool, args.adjudicate)
        losses = [quality.loss for quality in judge_moves(pool, moves)]
    model_name = args.model or "rookworld embedded model"
    engine = opponent if args.opponent == "stockfish" else None
    results = {"settings": {"model": model_name, "opponent": args.opponent, "skill": engine and engine.skill,
                            "depth": engine and engine.limit.depth, "seed": args.seed, "max_plies": args.max_plies,
                            "adjudicate": args.adjudicate, "judge_limit": LABEL_LIMIT.key()},
               **summary(played, losses), "play_s": play_s, "wall_s": time.perf_counter() - started}
    print(f"{model_name} vs {opponent.name}: {results['games']} games, +{results['wins']} ={results['draws']} "
          f"-{results['losses']} ({results['adjudicated']} adjudicated), score {results['score']:.3f} ± "
          f"{results['score_se'] or 0:.3f}, acpl {results['acpl']:.2f} pawns, illegal rate "
          f"{results['illegal_rate']:.3f}, mate in one {_share(results['mate_in_one'], results['mate_chances'])}, "
          f"{results['plies']} plies in {results['wall_s']:.0f} s")
    if args.pgn:
        write_pgn(args.pgn, played, model_name, opponent.name)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0
