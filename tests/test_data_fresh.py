"""Fresh A samples (`rookworld sft --fresh-a`): which training samples their games start from."""

import pytest

from rookworld.data.fresh import FreshASamples
from rookworld.data.record import a_sample
from rookworld.errors import UserError

# Real A prompts of the embedded dataset whose move ends the game, and one that does not.
MATE = ("A: 2b1n2k/rq3pp1/p6p/1p5N/3r3P/PPPB4/6P1/4R1K1 w - - 0 29+e1e8+"
        "d7e5 f5e5 c8e6 d1e1 e6c8 g3h5 d8d4 e5e8 f6e8 e1e8+")
STALEMATE = "A: 8/8/4B2R/k7/2K5/8/8/8 w - - 0 30+e6d7+e6d7+"
ILLEGAL = "A: 8/8/4B2R/k7/2K5/8/8/8 w - - 0 30+h6a6+h6a6+"  # the rook cannot pass its own bishop on e6
NORMAL = "A: 8/8/4B2R/k7/2K5/8/8/8 w - - 0 30+h6h1+h6h1+"


def test_games_start_only_after_moves_that_leave_a_move_to_play():
    ends = [a_sample(prompt) for prompt in (MATE, STALEMATE, ILLEGAL)]
    assert [s.meta["case"] for s in ends] == ["checkmate", "stalemate", "illegal"]
    with pytest.raises(UserError, match="--fresh-a needs A samples .* whose move is legal and does not end the game"):
        FreshASamples(ends, seed=0)  # before: accepted, then next() looped forever
    normal = a_sample(NORMAL)
    fresh = FreshASamples([*ends, normal], seed=0)
    assert fresh.base == [normal]
    drawn = [fresh.next() for _ in range(20)]
    assert all(s.task == "A" for s in drawn)
