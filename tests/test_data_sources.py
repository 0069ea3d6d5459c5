"""Loading samples: the real fixtures, files shaped like the hub dataset, hub loading through `datasets`,
bad rows, samples' JSON form and `rookworld data export`."""

import gzip
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import one_error_line

from rookworld import arbiter, cli, text
from rookworld.data import Sample, load_source
from rookworld.data.sources import embedded_path, load_files, load_hub
from rookworld.errors import UserError


def _write(path, rows):
    path.write_text("\n".join(rows) + "\n")
    return path


def test_real_p_lines_keep_their_text_and_rank_their_moves(fixtures_dir):
    lines = (fixtures_dir / "rook_val_sample.txt").read_text().splitlines()
    loaded = load_files(fixtures_dir / "rook_val_sample.txt", "all")
    assert loaded.report.samples == 250 and loaded.report.skipped == 0
    for line, sample in zip(lines, loaded.samples):
        assert sample.task == "P" and sample.prompt + sample.target == line
        analysis = sample.analysis
        assert analysis.limit == "data" and list(analysis.evals) == sorted(analysis.evals, reverse=True)
        parsed = text.parse_p_line(line)
        assert sorted(analysis.moves) == sorted(parsed.moves)
        assert sample.meta["label_best"] == parsed.best  # the data's own B:, kept beside the truth
    # the known quirk: for black the file's B: is not the best-evaluated move
    black = [s for s in loaded.samples if " b " in s.analysis.fen]
    assert sum(s.meta["label_best"] != s.analysis.best for s in black) > len(black) / 2


def test_hub_shaped_rows_load_from_txt_jsonl_parquet_and_gzip(hub_rows, tmp_path):
    txt = _write(tmp_path / "rows.txt", hub_rows)
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps({"text": row}) + "\n" for row in hub_rows)
    pq.write_table(pa.table({"text": hub_rows}), tmp_path / "rows.parquet")
    loaded = [load_files(path, "all").samples for path in (txt, tmp_path / "rows.jsonl.gz", tmp_path / "rows.parquet")]
    assert len(loaded[0]) == len(hub_rows) == 550
    assert [s.to_json() for s in loaded[0]] == [s.to_json() for s in loaded[1]] == [s.to_json() for s in loaded[2]]
    a_samples = [s for s in loaded[0] if s.task == "A"]
    assert len(a_samples) == 300 and all(s.prompt.startswith("A: ") for s in a_samples)  # prefix added where missing
    assert all(s.target == arbiter.a_target(arbiter.transition_for_prompt(s.prompt)) for s in a_samples)
    assert all("stated_target" not in s.meta for s in a_samples)


def test_a_rows_from_the_openings_fixture_match_python_chess(fixtures_dir, tmp_path):
    items = json.loads((fixtures_dir / "a_task_openings_sample.json").read_text())
    path = _write(tmp_path / "prompts.jsonl", [json.dumps({"task": "A", "prompt": i["prompt"]}) for i in items])
    samples = load_files(path, "all").samples
    assert len(samples) == len(items) == 870
    assert all(s.target.split("+")[0] == i["expected_fen"] for s, i in zip(samples, items))
    assert {s.meta["case"] for s in samples} <= {"normal", "first_move", "castling", "en_passant", "promotion"}


def test_a_directory_loads_all_its_data_files(hub_rows, tmp_path):
    _write(tmp_path / "a.txt", hub_rows[:250])
    _write(tmp_path / "b.jsonl", [json.dumps({"text": row}) for row in hub_rows[250:]])
    (tmp_path / "notes.md").write_text("not data")
    assert len(load_source(str(tmp_path), "all").samples) == 550


def test_a_corrupt_line_in_the_middle_is_skipped_counted_and_shown(hub_rows, tmp_path, caplog):
    rows = hub_rows[:3] + ["P: this is not a position M: e2e4 E: 0.1 B: e2e4"] + hub_rows[3:6]
    path = _write(tmp_path / "rows.txt", rows)
    jsonl = _write(tmp_path / "rows.jsonl", [json.dumps({"text": r}) for r in hub_rows[:2]] + ["{broken json"]
                   + [json.dumps({"text": r}) for r in hub_rows[2:4]])
    with caplog.at_level(logging.WARNING):
        loaded = load_files(path, "all")
        loaded_json = load_files(jsonl, "all")
    assert (loaded.report.samples, loaded.report.skipped) == (6, 1)
    assert (loaded_json.report.samples, loaded_json.report.skipped) == (4, 1)
    assert f"{path}:4" in caplog.text and f"{jsonl}:3" in caplog.text and "skipped 1 unparseable" in caplog.text
    assert [s.prompt + s.target for s in loaded.samples] == rows[:3] + rows[4:]


def test_a_stated_target_the_arbiter_disagrees_with_is_counted_and_replaced(hub_rows, tmp_path):
    a_row = hub_rows[260]
    wrong = a_row.rsplit("+", 3)[0] + "+1.0+1+0"  # claims a mate
    loaded = load_files(_write(tmp_path / "rows.txt", [a_row, wrong]), "all")
    assert loaded.report.overruled_targets == 1
    right, replaced = loaded.samples
    assert replaced.target == right.target and replaced.meta["stated_target"].endswith("+1.0+1+0")


def test_a_source_without_a_usable_row_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="garbage.txt: no usable row"):
        load_files(_write(tmp_path / "garbage.txt", ["hello", "world"]), "all")
    with pytest.raises(UserError, match="not a file or directory here"):
        load_source(str(tmp_path / "missing.jsonl"))
    for shaped_but_refused_by_the_hub in ("runs--old/data", "runs/data..", "runs/data."):  # the same rule as models'
        with pytest.raises(UserError, match="not a file or directory here, nor a hub dataset id"):
            load_source(shaped_but_refused_by_the_hub)
    with pytest.raises(UserError, match="unknown data file type"):
        load_source(str(_write(tmp_path / "rows.csv", ["x"])))


def test_a_file_that_cannot_be_read_as_its_type_is_one_error_line_naming_it(fixtures_dir, tmp_path, capsys):
    (tmp_path / "mixed").mkdir()
    shutil.copy(fixtures_dir / "rook_val_sample.txt", tmp_path / "mixed" / "a.txt")
    (tmp_path / "mixed" / "b.txt").write_bytes(b"caf\xe9\n")
    (tmp_path / "fake.jsonl.gz").write_text("not gzip\n")
    shard = next(embedded_path().rglob("shard-*.jsonl.gz")).read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(shard[:3000])
    (tmp_path / "fake.parquet").write_text("not parquet\n")
    expected = {"mixed": "mixed/b.txt: not valid UTF-8 text", "fake.jsonl.gz": "fake.jsonl.gz: not a valid gzip file",
                "cut.jsonl.gz": "cut.jsonl.gz: truncated", "fake.parquet": "fake.parquet: not a readable parquet file"}
    for name, message in expected.items():
        assert cli.main(["data", "stats", str(tmp_path / name)]) == 2
        assert message in one_error_line(capsys)


def test_hub_loading_reads_splits_through_datasets(hub_rows, tmp_path):
    pq.write_table(pa.table({"text": hub_rows[:400]}), tmp_path / "train.parquet")
    pq.write_table(pa.table({"text": hub_rows[400:]}), tmp_path / "test.parquet")
    files = {"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet")}
    train = load_hub("parquet", "train", data_files=files)
    held_out = load_hub("parquet", "eval", data_files=files)  # eval = the dataset's own test split
    both = load_hub("parquet", "all", data_files=files, limit=450)
    assert [s.prompt + s.target if s.task == "P" else s.prompt for s in train.samples[:250]] == hub_rows[:250]
    assert len(train.samples) == 400 and len(held_out.samples) == 150 and len(both.samples) == 450
    assert train.eval_fraction is None
    json_files = {"train": str(_write(tmp_path / "train.jsonl", [json.dumps({"text": r}) for r in hub_rows[:5]]))}
    assert len(load_hub("json", "train", data_files=json_files).samples) == 5


def test_an_uncached_hub_id_offline_fails_fast_with_a_user_error():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rookworld.cli", "data", "stats", "nobody-here/no-such-dataset-xyz"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "cannot load hub dataset 'nobody-here/no-such-dataset-xyz'" in done.stderr
    # an id shaped like `dir/name` may have been meant as a local path: the error says that there is none
    assert "no local file or directory 'nobody-here/no-such-dataset-xyz' exists either" in done.stderr
    assert time.monotonic() - started < 30


def test_sample_json_round_trip(fixtures_dir):
    for sample in load_files(fixtures_dir / "rook_val_sample.txt", "all").samples[:5]:
        assert Sample.from_json(json.loads(json.dumps(sample.to_json()))) == sample
    with pytest.raises(ValueError):
        Sample.from_json({"task": "X", "prompt": "", "target": ""})


def test_export_writes_samples_that_load_back_identically(hub_rows, tmp_path, capsys):
    source = _write(tmp_path / "rows.txt", hub_rows)
    out = tmp_path / "export" / "all.jsonl"
    assert cli.main(["data", "export", "--source", str(source), "--split", "all", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 550 and all({"task", "prompt", "target"} <= set(r) for r in records)
    again = load_source(str(out), "all").samples
    assert [s.to_json() for s in again] == [s.to_json() for s in load_source(str(source), "all").samples]


def test_export_refuses_an_out_that_would_not_load_back(hub_rows, tmp_path, capsys):
    source = _write(tmp_path / "rows.txt", hub_rows[:5])
    (tmp_path / "a_dir.jsonl").mkdir()
    for out, message in ((tmp_path / "a_dir.jsonl", " is a directory"),
                         (tmp_path / "new" / "exported.txt", ": export writes")):
        assert cli.main(["data", "export", "--source", str(source), "--out", str(out)]) == 2
        assert f"--out {out}{message}" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir.jsonl", "rows.txt"]  # nothing written or made


def test_stats_and_export_limit_read_the_first_samples_only(hub_rows, tmp_path, capsys):
    source = _write(tmp_path / "rows.txt", hub_rows)
    out = tmp_path / "first.jsonl"
    assert cli.main(["data", "export", "--source", str(source), "--split", "all", "--limit", "7", "--out",
                     str(out)]) == 0
    first = [s.to_json() for s in load_source(str(source), "all").samples[:7]]
    assert [json.loads(line) for line in out.read_text().splitlines()] == first
    capsys.readouterr()
    assert cli.main(["data", "stats", str(source), "--limit", "5"]) == 0
    assert "rows read: 5 in the split" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["data", "stats", str(source), "--limit", "0"]) == 2
    assert "--limit must be >= 1, got 0" in capsys.readouterr().err


def test_the_embedded_dataset_is_the_default_and_split_by_game():
    from rookworld.data.splits import sample_split

    # generated sets, one per side of the split: the eval side's games, the training side's A samples (of
    # self-play games) and P positions (of the embedded model's own games, listed best-first)
    for part, side in (("eval", "eval"), ("train/arbiter", "train"), ("train/games", "train")):
        manifest = json.loads((embedded_path() / part / "manifest.json").read_text())
        assert manifest["side"] == side and manifest["command"].startswith("rookworld data ")
        assert manifest["stockfish"]["label_limit"] == "depth=10"  # P labels at the label limit
    assert json.loads((embedded_path() / "train/games/manifest.json").read_text())["order"] == "best-first"
    size = sum(p.stat().st_size for p in embedded_path().rglob("*.jsonl.gz"))
    assert size < 10 * 2**20
    train = load_source(limit=300)  # the default source and split: embedded, train
    held_out = load_source("embedded", "eval", limit=3000)  # its P rows, then the first of its A rows
    assert train.source == "embedded" and train.split == "train"
    assert all(sample_split(s) == "train" for s in train.samples)
    assert all(sample_split(s) == "eval" for s in held_out.samples)
    assert {s.task for s in held_out.samples} == {"P", "A"}
