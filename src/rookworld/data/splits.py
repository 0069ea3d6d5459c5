"""Train/eval splits: held-out evaluation never sees a training game, nor a training position where
there is no game.

Hub datasets bring their own splits (`train`, `test`). Local and generated data are split by game when a
sample records the game it comes from (`meta.game`, stored as `g` in generated records): a hash of the
game id puts every position and A sample of one game on the same side. A sample without a game id (rows
of text files, old generated data such as the embedded set, synthetic A cases) is split by position: a
hash of the FEN's first four fields (board, side to move, castling, en passant) puts every occurrence of
a position, P row or A row, on the same side. `split_for` is the one rule; everything that splits data
(loading, `data stats`, manifests, fresh A samples) goes through it.

A split by game can put one position in a train game and in an eval game (openings, common endgames):
`stats.tally` reports how many eval samples ask about a position that the train split also has.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from rookworld.data.position import position_key
from rookworld.data.record import Sample
from rookworld.errors import UserError

Split = Literal["train", "eval", "all"]
SPLITS: tuple[Split, ...] = ("train", "eval", "all")
EVAL_FRACTION = 0.05
# Our split name -> the split name that Hugging Face hub datasets use.
HUB_SPLITS: dict[str, tuple[str, ...]] = {"train": ("train",), "eval": ("test",), "all": ("train", "test")}


def check_split(split: str) -> Split:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split  # type: ignore[return-value]


def stable_hash(key: str) -> int:
    """A 64-bit number fixed by `key` alone (stable across runs, machines and Python's hash seed)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def _fraction(key: str) -> float:
    return stable_hash(key) / 2.0**64


def position_fraction(fen: str) -> float:
    """A number in [0, 1) fixed by the position alone (stable across runs and machines)."""
    return _fraction(position_key(fen))


def game_fraction(game: str) -> float:
    """A number in [0, 1) fixed by the game id alone (stable across runs and machines)."""
    return _fraction("game " + game)


def split_for(fen: str, game: str | None = None, eval_fraction: float = EVAL_FRACTION) -> Literal["train", "eval"]:
    """The split of a sample or record: by its game id when it has one, else by its position."""
    fraction = game_fraction(game) if game is not None else position_fraction(fen)
    return "eval" if fraction < eval_fraction else "train"


def split_of(fen: str, eval_fraction: float = EVAL_FRACTION) -> Literal["train", "eval"]:
    """The split of a position that belongs to no game."""
    return split_for(fen, None, eval_fraction)


def sample_split(sample: Sample, eval_fraction: float = EVAL_FRACTION) -> Literal["train", "eval"]:
    return split_for(sample.fen, sample_game(sample), eval_fraction)


def sample_game(sample: Sample) -> str | None:
    """The id of the game a sample comes from, None when it has none."""
    game = sample.meta.get("game")
    return None if game is None else str(game)


def in_split(fen: str, split: Split, eval_fraction: float = EVAL_FRACTION, game: str | None = None) -> bool:
    return split == "all" or split_for(fen, game, eval_fraction) == split
