"""`rookworld data relabel` with the real engine: new P labels at the new limit, everything else (A
samples, game ids, splits, record order, display order) unchanged, byte-identical resume, the cache, and
clear errors."""

import gzip
import json
import shutil
import sqlite3

import pytest
from conftest import one_error_line

from rookworld import cli
from rookworld.data.generate import PROGRESS, GenerateConfig, generate
from rookworld.data.relabel import RelabelConfig, _order, relabel
from rookworld.data.sources import load_files
from rookworld.data.splits import sample_split
from rookworld.errors import UserError
from rookworld.stockfish import Limit, StockfishPool

pytestmark = pytest.mark.stockfish

TINY = dict(p_positions=10, a_samples=20, seed=3, depth=2, selfplay_nodes=100, shard_size=15, processes=2)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("relabel") / "data"
    generate(GenerateConfig(out=str(out), **TINY))
    return out


def _records(out):
    return {path.name: [json.loads(line) for line in gzip.open(path, "rt").read().splitlines()]
            for path in sorted(out.glob("shard-*.jsonl.gz"))}


def _bytes(out):
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*.jsonl.gz"))}


def test_relabel_searches_every_p_position_again_and_keeps_everything_else(source, tmp_path, capsys):
    out, cache = tmp_path / "deeper", tmp_path / "sf.sqlite"
    assert cli.main(["data", "relabel", "--data", str(source), "--out", str(out), "--depth", "4",
                     "--processes", "1", "--cache", str(cache)]) == 0
    assert "relabelled 10 P positions" in capsys.readouterr().out
    old, new = _records(source), _records(out)
    assert list(old) == list(new) and len(new) == 2
    p_fens = [r["fen"] for records in old.values() for r in records if r["t"] == "P"]
    with StockfishPool(processes=1) as pool:
        truth = {a.fen: a for a in pool.analyse(p_fens, Limit(depth=4), 5)}
    changed = 0
    for name in old:
        assert len(old[name]) == len(new[name])
        for before, after in zip(old[name], new[name]):
            if before["t"] == "A":
                assert after == before
                continue
            assert (after["fen"], after["g"], after["s"]) == (before["fen"], before["g"], before["s"])
            assert after["l"] == "depth=4" and before["l"] == "depth=2"
            assert (after["m"], after["e"]) == (list(truth[after["fen"]].moves), list(truth[after["fen"]].evals))
            changed += (after["m"], after["e"]) != (before["m"], before["e"])
    assert changed > 0  # depth 4 disagrees with depth 2 somewhere, so the labels really were replaced
    old_samples, new_samples = load_files(source, "all").samples, load_files(out, "all").samples
    assert [sample_split(s) for s in new_samples] == [sample_split(s) for s in old_samples]
    assert [s.prompt for s in new_samples] == [s.prompt for s in old_samples]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stockfish"]["label_limit"] == "depth=4"
    assert manifest["relabel"]["source_label_limit"] == "depth=2" and manifest["relabel"]["source"] == str(source)
    assert manifest["command"].startswith("rookworld data relabel") and "--cache" in manifest["command"]
    assert manifest["counts"] == json.loads((source / "manifest.json").read_text())["counts"]
    # --cache: every position's search went into the SQLite file
    with sqlite3.connect(cache) as db:
        stored = {fen for (fen,) in db.execute("SELECT fen FROM results WHERE search = 'depth=4'")}
    assert stored == set(p_fens)


def test_an_interrupted_relabel_resumes_to_the_same_bytes(source, tmp_path):
    out = tmp_path / "nodes"
    config = RelabelConfig(data=str(source), out=str(out), nodes=2000, processes=2)
    relabel(config)
    finished = _bytes(out)
    p_records = [r for records in _records(out).values() for r in records if r["t"] == "P"]
    assert {r["l"] for r in p_records} == {"nodes=2000"}
    assert all(r["e"] == sorted(r["e"], reverse=True) for r in p_records)  # ranked under a node limit too
    progress = json.loads((out / PROGRESS).read_text())
    last = sorted(progress["shards"])[-1]
    del progress["shards"][last]  # as if the run stopped before its last shard
    (out / PROGRESS).write_text(json.dumps(progress))
    (out / last).unlink()
    relabel(config)
    assert _bytes(out) == finished


def test_relabel_refuses_bad_input(source, tmp_path, capsys):
    with pytest.raises(UserError, match="no manifest.json"):
        relabel(RelabelConfig(data=str(tmp_path), out=str(tmp_path / "x")))
    assert cli.main(["data", "relabel", "--data", str(source), "--out", str(source)]) == 2
    assert "--out must differ from --data" in capsys.readouterr().err
    assert cli.main(["data", "relabel", "--data", str(source), "--out", str(tmp_path / "y"), "--depth", "3",
                     "--nodes", "100"]) == 2
    assert "give --depth or --nodes, not both" in capsys.readouterr().err
    used = tmp_path / "used"
    shutil.copytree(source, used)  # a generation directory: its progress.json is another job's
    with pytest.raises(UserError, match="other settings"):
        relabel(RelabelConfig(data=str(source), out=str(used), depth=3))


def test_relabel_refuses_a_broken_source_or_a_file_as_out_in_one_line(source, tmp_path, capsys):
    def relabel_cli(data, out):
        return cli.main(["data", "relabel", "--data", str(data), "--out", str(out), "--processes", "1"])

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert relabel_cli(source, a_file) == 2
    assert f"--out {a_file}: {a_file} is a file, not a directory" in one_error_line(capsys)
    manifest, shard = (source / "manifest.json").read_bytes(), (source / "shard-00000.jsonl.gz").read_bytes()
    for name, broken_file, content, message in (
            ("empty", "manifest.json", b"{}", " is not a `rookworld data generate` manifest"),
            ("not_json", "manifest.json", b"not json", " is not a `rookworld data generate` manifest"),
            ("junk", "shard-00000.jsonl.gz", b"junk\n", ": not a valid gzip file"),
            ("bad_json", "shard-00000.jsonl.gz", gzip.compress(b"not json\n"), ":1: invalid JSON")):
        broken = tmp_path / name
        broken.mkdir()
        (broken / "manifest.json").write_bytes(manifest)
        (broken / "shard-00000.jsonl.gz").write_bytes(shard)
        (broken / broken_file).write_bytes(content)
        assert relabel_cli(broken, tmp_path / f"{name}-out") == 2
        assert f"{broken / broken_file}{message}" in one_error_line(capsys)


def test_a_changed_line_count_gets_an_order_drawn_from_the_position():
    fen = "8/8/8/8/8/8/k7/7K w - - 0 1"
    assert _order(fen, [2, 0, 1], 3) == [2, 0, 1]
    drawn = _order(fen, [2, 0, 1, 4, 3], 3)
    assert sorted(drawn) == [0, 1, 2] and _order(fen, [0], 3) == drawn
    assert _order(fen, [0, 1, 2, 3, 4], 3, "best-first") == [0, 1, 2]  # best-first data stays best first
