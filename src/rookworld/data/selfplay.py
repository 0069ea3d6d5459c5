"""Stockfish self-play games for data generation: diverse rather than strong.

Each game opens with a few uniformly random legal plies, then every move is drawn from a softmax over
the multipv evals of a cheap search (temperature in pawns), and it runs to mate, a draw that can be
claimed, or a ply cap, so that endgames appear too. Games are played in lockstep so that each ply of
all running games is one parallel batch for the engine pool.
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


def choose_move(analysis: Analysis, rng: np.random.Generator, temperature: float) -> str:
    """A move drawn with probability proportional to exp(eval / temperature) (evals in pawns)."""
    if temperature <= 0 or len(analysis.moves) == 1:
        return analysis.moves[0]
    evals = np.asarray(analysis.evals, dtype=np.float64)  # (K,)
    weights = np.exp((evals - evals.max()) / temperature)  # (K,), max weight 1: no overflow
    return analysis.moves[int(rng.choice(len(weights), p=weights / weights.sum()))]


def _random_opening(rng: np.random.Generator, config: SelfPlayConfig) -> chess.Board:
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
    boards = [_random_opening(rng, config) for _ in range(count)]
    running = [board for board in boards if _running(board, config)]
    while running:
        analyses = pool.analyse([board.fen() for board in running], config.limit, config.multipv)
        for board, analysis in zip(running, analyses):
            board.push_uci(choose_move(analysis, rng, config.temperature))
        running = [board for board in running if _running(board, config)]
    return [Game(tuple(move.uci() for move in board.move_stack)) for board in boards]
