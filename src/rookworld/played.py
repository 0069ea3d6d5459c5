"""A prompts from the policy's own games: `rookworld train --a-source play|mix`.

`Games` keeps GAMES games going, each begun at a position of the training data's A prompts (the FEN before their
move, with the moves that led to it). Asked for k A prompts, it takes the next k games in turn and samples one P
completion for each game's position from the policy (at the P temperature and nucleus, on a random stream seeded by
the run's seed and its count of draws). The A prompt asks about that completion's `B:` move, legal or not (its first
`M:` candidate when it names no usable `B:`, a random legal move when it names no move at all), with the game's last
moves as its history; the target is the arbiter's. A legal move that does not end the game is played and the game
goes on; after an illegal move, or one that ends the game, the game begins again at another data position.

`PlayedSampler` draws every batch from the data sampler, so its P prompts are those `--a-source data` trains on, and
replaces each A prompt by a played one (play) or every second A prompt (mix).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import chess
import numpy as np
import torch

from rookworld.arbiter import ILLEGAL
from rookworld.data.record import Sample, a_sample
from rookworld.errors import InvalidPromptError, UserError
from rookworld.generation import SamplingSettings, decoding, generate_groups
from rookworld.rollout import chunk_generator
from rookworld.runtime import Dist, all_gather_objects
from rookworld.text import MAX_HISTORY, a_prompt, p_prompt, parse_a_prompt, parse_p_completion

GAMES = 32  # games kept going: each is moved on once every GAMES / (A prompts a step) steps
PLAYED_STREAM = 2**31  # the chunk number of the games' random streams (rollout chunks count from 0 in a step)


class Games:
    """The policy's games (module docstring). `policy`, `tokenizer`, `settings` (the P prompts' sampling) and
    `decoder` are the run's; the moves are sampled on the main rank and shared, so every rank plays the same games."""

    def __init__(self, samples: Sequence[Sample], policy, tokenizer, settings: SamplingSettings, seed: int,
                 d: Dist, decoder=None) -> None:
        self.starts = [s.prompt for s in samples if s.task == "A"]
        if not self.starts:
            raise UserError(f"--a-source play and mix begin their games at the training data's A positions, but "
                            f"none of its {len(samples)} samples is an A prompt; use --a-source data")
        self.policy, self.tokenizer, self.settings, self.decoder, self.d = policy, tokenizer, settings, decoder, d
        self.seed = seed
        self.rng = np.random.default_rng([seed, PLAYED_STREAM])
        self.games: list[tuple[str, list[str]]] = [self._start() for _ in range(GAMES)]
        self.cursor = 0
        self.draws = 0

    def _start(self) -> tuple[str, list[str]]:
        """A new game: a random data A prompt's position and the moves before it."""
        parsed = parse_a_prompt(self.starts[int(self.rng.integers(len(self.starts)))])
        return parsed.fen, parsed.history[:-1]

    def next(self, count: int) -> list[Sample]:
        """`count` A prompts, one move of the next `count` games in turn each; those games are moved on."""
        picked = [(self.cursor + i) % GAMES for i in range(count)]
        self.cursor = (self.cursor + count) % GAMES
        completions = self._completions([self.games[i][0] for i in picked]) if count else []
        self.draws += 1
        samples = []
        for i, completion in zip(picked, completions):
            fen, history = self.games[i]
            sample = self._ask(fen, history, completion)
            samples.append(sample)
            truth = sample.target.split("+")
            if truth[1] == ILLEGAL or truth[2] == "1" or truth[3] == "1":
                self.games[i] = self._start()
            else:
                self.games[i] = (truth[0], [*history, parse_a_prompt(sample.prompt).move][-MAX_HISTORY:])
        return samples

    @torch.no_grad()
    def _completions(self, fens: list[str]) -> list[str]:
        """The policy's sampled P completion for each position (the main rank's, on every rank)."""
        texts = None
        if self.d.main:
            runner, step = decoding(self.policy, self.decoder)
            generator = chunk_generator(self.seed, self.draws, PLAYED_STREAM, self.policy.wte.weight.device)
            gen = generate_groups(runner, self.tokenizer.encode_prompts([p_prompt(fen) for fen in fens]), 1,
                                  self.settings, eos_id=self.tokenizer.eos_id, generator=generator, decode_step=step)
            texts = self.tokenizer.decode_batch(gen.completions())
        return all_gather_objects(texts, self.d)[0]

    def _ask(self, fen: str, history: list[str], completion: str) -> Sample:
        """The A sample of the completion's move in the game at `fen` after `history` (module docstring)."""
        parsed = parse_p_completion(completion)
        for move in [parsed.best, *parsed.moves[:1]]:
            if move:
                try:
                    return a_sample(a_prompt(fen, move, [*history, move]), {"source": "play"})
                except InvalidPromptError:
                    continue
        legal = sorted(move.uci() for move in chess.Board(fen).legal_moves)
        move = legal[int(self.rng.integers(len(legal)))]
        return a_sample(a_prompt(fen, move, [*history, move]), {"source": "play"})

    def state_dict(self) -> dict[str, Any]:
        return {"games": [[fen, list(history)] for fen, history in self.games], "cursor": self.cursor,
                "draws": self.draws, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.games = [(fen, list(history)) for fen, history in state["games"]]
        self.cursor, self.draws = state["cursor"], state["draws"]
        self.rng.bit_generator.state = state["rng"]


class PlayedSampler:
    """The data sampler's batches with their A prompts (play), or every second one (mix), from `games`."""

    def __init__(self, data, games: Games, source: str) -> None:
        if source not in ("play", "mix"):
            raise ValueError(f"PlayedSampler's source is play or mix, got {source!r}")
        self.data, self.games, self.source = data, games, source
        self.turn = 0  # mix: A prompts seen, the odd ones played

    def next(self, batch_size: int) -> list[Sample]:
        """The data sampler's next batch (P prompts first, then A), its A prompts replaced as the source says."""
        batch = self.data.next(batch_size)
        slots = [i for i, s in enumerate(batch) if s.task == "A"]
        if self.source == "mix":
            slots = [i for n, i in enumerate(slots, start=self.turn) if n % 2 == 1]
            self.turn += sum(s.task == "A" for s in batch)
        for i, sample in zip(slots, self.games.next(len(slots))):
            batch[i] = sample
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {**self.data.state_dict(), "played": {"source": self.source, "turn": self.turn,
                                                     **self.games.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where the sampler that saved `state` was (its source checked by `saved_source` first)."""
        played = state["played"]
        self.data.load_state_dict({k: v for k, v in state.items() if k != "played"})
        self.turn = played["turn"]
        self.games.load_state_dict(played)


def saved_source(sampler_state: dict[str, Any]) -> str:
    """The --a-source a checkpoint's sampler state was drawn with."""
    return sampler_state.get("played", {}).get("source", "data")
