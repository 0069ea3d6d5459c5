"""Held-out data never shares a position with training data."""

import pytest

from rookworld.data.position import position_key
from rookworld.data.sources import load_files
from rookworld.data.splits import position_fraction, split_of
from rookworld.errors import UserError


@pytest.fixture(scope="module")
def rows_file(hub_rows, tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "rows.txt"
    path.write_text("\n".join(hub_rows) + "\n")
    return path


def test_train_and_eval_share_no_position_and_cover_all(rows_file):
    everything = load_files(rows_file, "all").samples
    train = load_files(rows_file, "train", eval_fraction=0.2).samples
    held_out = load_files(rows_file, "eval", eval_fraction=0.2).samples
    train_keys = {position_key(s.fen) for s in train}
    eval_keys = {position_key(s.fen) for s in held_out}
    assert train_keys and eval_keys and not train_keys & eval_keys
    assert len(train) + len(held_out) == len(everything)
    assert 0.1 < len(held_out) / len(everything) < 0.3


def test_the_split_ignores_move_counters_and_is_stable():
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    same_position = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 40 77"
    assert position_fraction(fen) == position_fraction(same_position)
    assert split_of(fen) == split_of(same_position)
    # a fixed number (blake2b of the position), the same on every machine and in every Python run
    assert position_fraction(fen) == pytest.approx(0.9280170634112233, abs=1e-12)
    assert split_of(fen, eval_fraction=0.93) == "eval" and split_of(fen, eval_fraction=0.92) == "train"


def test_an_empty_split_and_an_unknown_split_are_user_errors(rows_file, tmp_path):
    one_row = tmp_path / "one.txt"
    one_row.write_text(rows_file.read_text().splitlines()[0] + "\n")
    missing = "eval" if split_of(load_files(one_row, "all").samples[0].fen) == "train" else "train"
    with pytest.raises(UserError, match=f"none in the {missing} split"):
        load_files(one_row, missing)
    with pytest.raises(UserError, match="unknown split"):
        load_files(one_row, "test")
