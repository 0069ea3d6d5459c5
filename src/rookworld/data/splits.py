"""Train/eval splits: held-out evaluation never sees a training position.

Hub datasets bring their own splits (`train`, `test`). Local and generated data are split by
position: a hash of the FEN's first four fields (board, side to move, castling, en passant) puts every
occurrence of a position, P row or A row, on the same side.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from rookworld.data.position import position_key
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


def position_fraction(fen: str) -> float:
    """A number in [0, 1) fixed by the position alone (stable across runs and machines)."""
    digest = hashlib.blake2b(position_key(fen).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_of(fen: str, eval_fraction: float = EVAL_FRACTION) -> Literal["train", "eval"]:
    return "eval" if position_fraction(fen) < eval_fraction else "train"


def in_split(fen: str, split: Split, eval_fraction: float = EVAL_FRACTION) -> bool:
    return split == "all" or split_of(fen, eval_fraction) == split
