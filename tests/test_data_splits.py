"""Held-out data never shares a game with training data, nor a position where there is no game id; the
positions that a split by game shares are counted."""

import gzip
import itertools
import json

import pytest

from rookworld import cli
from rookworld.data import store
from rookworld.data.position import position_key
from rookworld.data.sources import load_files
from rookworld.data.splits import game_fraction, position_fraction, sample_split, split_for, split_of
from rookworld.data.stats import tally
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


def _embedded_records():
    """Real generated records with their game ids removed (as data generated before ids was): the first 150 (P)
    and the last 150 (A) of an embedded shard, and one more P record."""
    from rookworld.data.sources import embedded_path

    with gzip.open(embedded_path() / "eval" / "shard-00000.jsonl.gz", "rt") as handle:
        records = [{key: value for key, value in json.loads(line).items() if key != "g"} for line in handle]
    assert records[150]["t"] == "P" and records[-150]["t"] == "A"
    return records[:150] + records[-150:], records[150]


def _write_records(path, records):
    store.write_jsonl_gz(path, records)
    return path


def test_the_game_id_decides_the_split_and_is_stable():
    assert game_fraction("0-3-17") == pytest.approx(0.02038757518578551, abs=1e-12)
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"  # position_fraction 0.928
    assert split_for(fen) == split_of(fen) == "train"
    assert split_for(fen, "0-3-17") == "eval" and split_for(fen, "0-3-17", eval_fraction=0.02) == "train"


def test_records_split_by_game_when_they_have_an_id_else_by_position(tmp_path, capsys):
    records, shared = _embedded_records()
    plain = load_files(_write_records(tmp_path / "plain.jsonl.gz", records), "eval", eval_fraction=0.2).samples
    assert plain and all("game" not in s.meta for s in plain)
    assert [s.prompt for s in plain] == [s.prompt for s in load_files(tmp_path / "plain.jsonl.gz", "all").samples
                                         if split_of(s.fen, 0.2) == "eval"]

    # the same records, 10 to a game; the last 100 stay without an id
    with_ids = [{**r, "g": f"x-{i // 10}"} if i < 200 else r for i, r in enumerate(records)]
    # one position twice, in a train game and in an eval game (as openings do): both kept, the overlap counted
    eval_game = next(f"x-{i}" for i in itertools.count(20) if game_fraction(f"x-{i}") < 0.05)  # eval at 0.2 too
    train_game = next(f"x-{i}" for i in itertools.count(20) if game_fraction(f"x-{i}") >= 0.2)
    with_ids += [{**shared, "g": eval_game}, {**shared, "g": train_game}]
    path = _write_records(tmp_path / "games.jsonl.gz", with_ids)
    everything = load_files(path, "all").samples
    assert [s.meta.get("game") for s in everything] == [r.get("g") for r in with_ids]
    sides = {split: load_files(path, split, eval_fraction=0.2).samples for split in ("train", "eval")}
    assert len(sides["train"]) + len(sides["eval"]) == len(with_ids)
    games = {split: {s.meta["game"] for s in samples if "game" in s.meta} for split, samples in sides.items()}
    assert games["train"] and games["eval"] and not games["train"] & games["eval"]
    for split, samples in sides.items():
        assert all(split_for(s.fen, s.meta.get("game"), 0.2) == split for s in samples)
        assert all(split_of(s.fen, 0.2) == split for s in samples if "game" not in s.meta)
        assert all(sample_split(s, 0.2) == split for s in samples)
    assert [sum(s.fen == shared["fen"] for s in sides[split]) for split in ("train", "eval")] == [1, 1]

    counts = tally(everything, 0.2)
    train_keys = {position_key(s.fen) for s in sides["train"]}
    expected = {t: sum(s.task == t and position_key(s.fen) in train_keys for s in sides["eval"]) for t in ("A", "P")}
    assert counts["eval_positions_in_train"] == expected and expected["P"] >= 1
    assert counts["split"]["eval"] == {t: sum(s.task == t for s in sides["eval"]) for t in ("A", "P")}
    # `data stats` shows the figure, at the default eval fraction
    assert cli.main(["data", "stats", str(path)]) == 0
    rows = [[cell.strip() for cell in line.split("│")[1:4]] for line in capsys.readouterr().out.splitlines()
            if "eval, position in train" in line]
    default = tally(everything)["eval_positions_in_train"]
    assert rows == [["eval, position in train", t, str(default[t])] for t in ("A", "P")] and default["P"] >= 1


def test_old_records_decode_as_before_and_ids_round_trip():
    for record in _embedded_records()[0][::5]:
        sample = store.decode(record)
        assert "game" not in sample.meta and "g" not in store.encode(sample, record.get("s"))
        assert store.encode(sample, record.get("s")) == record
        tagged = store.decode({**record, "g": "7-0-3"})
        assert tagged.meta == {**sample.meta, "game": "7-0-3"} and (tagged.prompt, tagged.target) == (
            sample.prompt, sample.target)
        assert store.encode(tagged, record.get("s")) == {**record, "g": "7-0-3"}


@pytest.mark.integration
def test_the_embedded_set_is_split_by_game_with_fresh_eval_games():
    from rookworld.data.sources import embedded_path, load_source

    parts = ("eval", "train/arbiter", "train/games")
    manifests = {part: json.loads((embedded_path() / part / "manifest.json").read_text()) for part in parts}
    samples = load_source("embedded", "all").samples
    counts = tally(samples)
    assert {part: manifests[part]["counts"]["split"] for part in parts} == {
        "eval": {"eval": {"A": 5000, "P": 1500}}, "train/arbiter": {"train": {"A": 95000}},
        "train/games": {"train": {"P": 4000}}}
    assert counts["split"] == {"eval": {"A": 5000, "P": 1500}, "train": {"A": 95000, "P": 4000}}
    # the eval side is other games (seed 2) than the training side: the A samples of self-play games of seed 0
    # (the embedded model's SFT games), the P positions of the embedded model's own games (seed 100)
    seeds = {}
    for sample in samples:
        if "game" in sample.meta:
            seeds.setdefault((sample_split(sample), sample.task), set()).add(sample.meta["game"].split("-")[0])
    assert seeds == {("train", "A"): {"0"}, ("train", "P"): {"100"}, ("eval", "A"): {"2"}, ("eval", "P"): {"2"}}
    assert counts["eval_positions_in_train"] == {"A": 94, "P": 25}  # chance positions, see data-reference.md
