"""Stockfish self-play games for data generation: diverse rather than strong.

Each game opens with a few uniformly random legal plies, then every move is drawn from a softmax over the
multipv evals of a cheap search (temperature in pawns), or with `random_move_rate` R each move is a uniformly
random legal one with probability R (a weaker player's positions: its blunders and what follows them), and it
runs to mate, a draw that can be claimed, or a ply cap, so that endgames appear too. Games are played in
lockstep so that each ply of all running games is one parallel batch for the engine pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import chess
import numpy as np

from rookworld.analysis import Analysis
from rookworld.data.games import Game
from rookworld.stockfish import Limit, StockfishPool


@dataclass(frozen=True)
class SelfPlayConfig:
    limit: Limit = Limit(nodes=1000)
    multipv: int = 5
    temperature: float = 0.3  # pawns; 0 plays the engine's best move
    min_random_plies: int = 2
    max_random_plies: int = 8
    max_plies: int = 300
    random_move_rate: float = 0.0


def choose_move(analysis: Analysis, rng: np.random.Generator, temperature: float) -> str:
    """A move drawn with probability proportional to exp(eval / temperature) (evals in pawns)."""
    if temperature <= 0 or len(analysis.moves) == 1:
        return analysis.moves[0]
    evals = np.asarray(analysis.evals, dtype=np.float64)  # (K,)
    weights = np.exp((evals - evals.max()) / temperature)  # (K,), max weight 1: no overflow
    return analysis.moves[int(rng.choice(len(weights), p=weights / weights.sum()))]


def random_opening(rng: np.random.Generator, config: SelfPlayConfig) -> chess.Board:
    board = chess.Board()
    for _ in range(int(rng.integers(config.min_random_plies, config.max_random_plies + 1))):
        moves = list(board.legal_moves)
        if not moves:
            break
        board.push(moves[int(rng.integers(len(moves)))])
    return board


def _running(board: chess.Board, config: SelfPlayConfig) -> bool:
    return board.ply() < config.max_plies and not board.is_game_over(claim_draw=True)


def play_games(pool: StockfishPool, count: int, rng: np.random.Generator,
               config: SelfPlayConfig = SelfPlayConfig()) -> list[Game]:
    boards = [random_opening(rng, config) for _ in range(count)]
    running = [board for board in boards if _running(board, config)]
    while running:
        rate = config.random_move_rate
        at_random = [rate > 0 and rng.random() < rate for _ in running]
        searched = [board for board, chance in zip(running, at_random) if not chance]
        analyses = iter(pool.analyse([board.fen() for board in searched], config.limit, config.multipv)
                        if searched else ())
        for board, chance in zip(running, at_random):
            if chance:
                moves = list(board.legal_moves)
                board.push(moves[int(rng.integers(len(moves)))])
            else:
                board.push_uci(choose_move(next(analyses), rng, config.temperature))
        running = [board for board in running if _running(board, config)]
    return [Game(tuple(move.uci() for move in board.move_stack)) for board in boards]
