"""The model as a chess player: for a position, its greedy `B:` move, or a random legal move when that
move is illegal or missing. Used by `rookworld play`; meant to serve a UCI engine as well.

The prompt is `P: <FEN>` encoded as training and evaluation encode it (after an EOS token); the
completion limit is `rookworld sample`'s default, which fits the model's context.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import chess

from rookworld.arbiter import legal_move
from rookworld.text import p_prompt, parse_p_completion


@dataclass(frozen=True)
class Choice:
    """The move played, whether it is the model's own legal `B:` move (False: the random fallback
    replaced it) and the model's raw completion."""

    move: chess.Move
    own: bool
    completion: str


def choose_move(board: chess.Board, completion: str, rng: random.Random) -> Choice:
    """The completion's `B:` move when it is legal on `board`, else a uniformly random legal move
    drawn from `rng`. `board` must have a legal move."""
    move = legal_move(board, parse_p_completion(completion).best)
    if move is not None:
        return Choice(move, True, completion)
    return Choice(rng.choice(list(board.legal_moves)), False, completion)


class ModelPlayer:
    """A GPT-2 RookWorld model and its tokenizer, choosing moves greedily; the fallback draws from the stream
    `SEED/STREAM` (a second model in the same games draws from another)."""

    def __init__(self, model, tokenizer, seed: int = 0, stream: str = "fallback") -> None:
        self.model, self.tokenizer = model, tokenizer
        self.rng = random.Random(f"{seed}/{stream}")

    @classmethod
    def load(cls, name_or_path: str | Path | None = None, device: str | None = None, threads: int | None = None,
             seed: int = 0, stream: str = "fallback") -> ModelPlayer:
        """The checkpoint (default: the embedded model) on `device` (default: cuda when available, else cpu
        with `threads` torch threads)."""
        from rookworld.hub import load_model, resolve_default_model
        from rookworld.runtime import pick_device

        model, tokenizer = load_model(name_or_path or resolve_default_model(), device=pick_device(device, threads))
        return cls(model, tokenizer, seed, stream)

    def choose(self, boards: Sequence[chess.Board]) -> list[Choice]:
        """One choice per board (each with a legal move), from one batched greedy generation."""
        from rookworld.generation import SamplingSettings, generate_groups
        from rookworld.sample import DEFAULT_MAX_NEW_TOKENS

        if not boards:
            return []
        ids = self.tokenizer.encode_prompts([p_prompt(board.fen()) for board in boards])
        context = self.model.config.n_positions
        settings = [SamplingSettings(max_new_tokens=min(DEFAULT_MAX_NEW_TOKENS, context - len(p))) for p in ids]
        generation = generate_groups(self.model, ids, 1, settings, eos_id=self.tokenizer.eos_id, greedy=True)
        completions = self.tokenizer.decode_batch(generation.completions())
        return [choose_move(board, completion, self.rng) for board, completion in zip(boards, completions)]
