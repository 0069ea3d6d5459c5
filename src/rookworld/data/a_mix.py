"""The A-sample mix of generated data: game moves as played, plus rare cases added on purpose.

| case                  | share | where it comes from                                                     |
|-----------------------|-------|-------------------------------------------------------------------------|
| (game moves)          | rest  | plies of the games, the move as played (its case as it happens to be)  |
| illegal               | 6%    | a game position and an illegal move (`cases.illegal_move`)              |
| checkmate             | 4%    | games' final moves, else a synthetic position (heavy pieces vs a king) |
| promotion             | 4%    | a promotion found in a game position, else synthetic (pawn on the 7th) |
| insufficient_material | 3%    | as checkmate (synthetic: capture of the last piece that could mate)    |
| en_passant            | 3%    | as promotion (synthetic: right after a double pawn step)               |
| castling              | 3%    | a castling move found in a game position                                |
| stalemate             | 2%    | as checkmate                                                            |
| first_move            | 0.4%  | the initial position, or black's first reply (only 420 such prompts)    |

History follows the original data: the last up to 10 moves of the game, the current move last. A case
that cannot be filled (all first moves used, a PGN without castling) is made up with game moves. A sample
made from a game position carries the ply's game id (meta.game); synthetic and first-move samples have none.
With a `side` of the split (generate.py's `--side`), a sample on the other side is refused like a repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import chess
import numpy as np

from rookworld import text
from rookworld.data.cases import case_moves, illegal_move
from rookworld.data.games import Ply
from rookworld.data.record import Sample, a_sample
from rookworld.data.splits import Split, sample_split
from rookworld.data.synthetic import RECIPES, synthetic_case

RARE_SHARES = {"illegal": 0.06, "checkmate": 0.04, "promotion": 0.04, "insufficient_material": 0.03,
               "en_passant": 0.03, "castling": 0.03, "stalemate": 0.02, "first_move": 0.004}
SYNTHETIC_CASES = (*RECIPES, "en_passant")
# Searched in every game position: cheap to find (no trial moves), unlike mates and draws.
GAME_SCAN_CASES = ("promotion", "en_passant", "castling")
_ATTEMPTS_PER_SAMPLE = 2000  # synthetic and first-move attempts before a case counts as exhausted


def _game_meta(game: str | None) -> dict[str, str]:
    return {"game": game} if game is not None else {}


def rare_quotas(count: int) -> dict[str, int]:
    return {case: round(count * share) for case, share in RARE_SHARES.items()}


class AMixer:
    """Builds one shard's A samples; `seen` (prompts already used, shared across shards) keeps them unique,
    `side` keeps them on that side of the split ("all": either)."""

    def __init__(self, rng: np.random.Generator, seen: set[str], side: Split = "all") -> None:
        self.rng = rng
        self.seen = seen
        self.side = side
        self.samples: list[Sample] = []

    def _on_side(self, sample: Sample) -> bool:
        return self.side == "all" or sample_split(sample) == self.side

    def _add(self, fen: str, move: str, history: Sequence[str], case: str | None = None,
             game: str | None = None) -> bool:
        """Add the sample of this move unless its prompt was used, it is on the other side, or (when `case` is
        given) it is another case."""
        prompt = text.a_prompt(fen, move, [*history, move])
        if prompt in self.seen:
            return False
        sample = a_sample(prompt, _game_meta(game))
        if not self._on_side(sample) or (case is not None and sample.meta["case"] != case):
            return False
        self.seen.add(prompt)
        self.samples.append(sample)
        return True

    def _fill(self, count: int, attempt: Callable[[], bool]) -> int:
        """Call `attempt` until it added `count` samples or gave up; the number it fell short."""
        added = tries = 0
        while added < count and tries < _ATTEMPTS_PER_SAMPLE * count:
            tries += 1
            added += attempt()
        return count - added

    def build(self, games: Sequence[Sequence[Ply]], count: int) -> list[Sample]:
        """`count` A samples (fewer only when the plies run out) from the games' plies and the recipes."""
        plies = [ply for game in games for ply in game]
        quotas = rare_quotas(count)
        if plies:
            quotas["illegal"] = self._fill(quotas["illegal"], lambda: self._illegal(plies))
            self._game_endings(games, quotas)
            self._scan_games(games, quotas)
        for case in SYNTHETIC_CASES:
            quotas[case] = self._fill(quotas[case], lambda case=case: self._synthetic(case))
        quotas["first_move"] = self._fill(quotas["first_move"], self._first_move)
        for index in self.rng.permutation(len(plies)):
            if len(self.samples) >= count:
                break
            ply = plies[int(index)]
            self._add(ply.fen, ply.move, ply.history, game=ply.game)
        return self.samples

    def _illegal(self, plies: Sequence[Ply]) -> bool:
        ply = plies[int(self.rng.integers(len(plies)))]
        return self._add(ply.fen, illegal_move(chess.Board(ply.fen), self.rng).uci(), ply.history, "illegal", ply.game)

    def _game_endings(self, games: Sequence[Sequence[Ply]], quotas: dict[str, int]) -> None:
        """Games' final moves that mate or draw, while their case still has room."""
        for game in games:
            if game:
                last = game[-1]
                sample = a_sample(text.a_prompt(last.fen, last.move, [*last.history, last.move]), _game_meta(last.game))
                case = sample.meta["case"]
                if quotas.get(case, 0) > 0 and sample.prompt not in self.seen and self._on_side(sample):
                    self.seen.add(sample.prompt)
                    self.samples.append(sample)
                    quotas[case] -= 1

    def _scan_games(self, games: Sequence[Sequence[Ply]], quotas: dict[str, int]) -> None:
        """Rare legal moves found in game positions: games in random order, at most one sample per game
        and case, drawn from all of that game's moves of the case."""
        for index in self.rng.permutation(len(games)):
            open_cases = [case for case in GAME_SCAN_CASES if quotas[case] > 0]
            if not open_cases:
                return
            game = games[int(index)]
            if not game:
                continue
            board = chess.Board(game[0].fen)
            candidates: dict[str, list[tuple[Ply, chess.Move]]] = {case: [] for case in open_cases}
            for ply in game:
                for case, moves in case_moves(board, open_cases).items():
                    candidates[case].extend((ply, move) for move in moves)
                board.push_uci(ply.move)
            for case in open_cases:
                if candidates[case]:
                    ply, move = candidates[case][int(self.rng.integers(len(candidates[case])))]
                    quotas[case] -= self._add(ply.fen, move.uci(), ply.history, case, ply.game)

    def _synthetic(self, case: str) -> bool:
        made = synthetic_case(case, self.rng)
        return made is not None and self._add(made[0].fen(), made[1].uci(), made[2], case)

    def _first_move(self) -> bool:
        board = chess.Board()
        history: list[str] = []
        for _ in range(1 + int(self.rng.integers(2))):  # white's first move, or black's first reply
            if history:
                board.push_uci(history[-1])
            moves = list(board.legal_moves)
            history.append(moves[int(self.rng.integers(len(moves)))].uci())
        return self._add(board.fen(), history[-1], history[:-1], "first_move")
