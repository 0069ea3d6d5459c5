"""Candidate order of P targets: `data generate --order best-first` and `data render` write the engine's ranking
(B: = the first M:) or a shuffle; parsers, rewards and metrics grade both the same."""

import gzip
import json

import pytest
from conftest import one_error_line

from rookworld import cli
from rookworld.data.generate import GenerateConfig, generate
from rookworld.data.sources import load_files
from rookworld.metrics import p_metrics
from rookworld.rewards import score_p
from rookworld.text import parse_p_completion

TINY = dict(p_positions=8, a_samples=10, seed=5, depth=2, selfplay_nodes=100, shard_size=20, processes=1)


def _records(out):
    return [json.loads(line) for path in sorted(out.glob("shard-*.jsonl.gz"))
            for line in gzip.open(path, "rt").read().splitlines()]


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory):
    out = tmp_path_factory.mktemp("order") / "shuffled"
    generate(GenerateConfig(out=str(out), **TINY))
    return out


def _p_targets(out):
    return [s for s in load_files(out, "all").samples if s.task == "P"]


@pytest.mark.stockfish
def test_best_first_generation_lists_the_ranking_and_keeps_the_games(shuffled, tmp_path):
    out = tmp_path / "best"
    manifest = generate(GenerateConfig(out=str(out), order="best-first", **TINY))
    assert manifest["order"] == "best-first" and "--order best-first" in manifest["command"]
    before, after = _records(shuffled), _records(out)
    # the same positions, analyses, A samples and games: only the display order differs
    assert [{k: v for k, v in r.items() if k != "s"} for r in before] == \
        [{k: v for k, v in r.items() if k != "s"} for r in after]
    assert any(r["s"] != sorted(r["s"]) for r in before if r["t"] == "P")
    for sample in _p_targets(out):
        parsed = parse_p_completion(sample.target)
        assert parsed.moves == list(sample.analysis.moves) and parsed.evals == list(sample.analysis.evals)
        assert parsed.best == parsed.moves[0] == sample.analysis.moves[0]


@pytest.mark.stockfish
def test_render_rewrites_the_order_without_an_engine_and_both_orders_grade_alike(shuffled, tmp_path, capsys):
    best, again = tmp_path / "best", tmp_path / "shuffled-again"
    assert cli.main(["data", "render", "--data", str(shuffled), "--out", str(best), "--order", "best-first"]) == 0
    assert "rendered {'A': 10, 'P': 8}" in capsys.readouterr().out
    manifest = json.loads((best / "manifest.json").read_text())
    assert manifest["order"] == "best-first" and manifest["render"]["source_order"] == "shuffled"
    old, new = _p_targets(shuffled), _p_targets(best)
    assert [s.analysis for s in old] == [s.analysis for s in new]
    assert all(parse_p_completion(s.target).moves == list(s.analysis.moves) for s in new)
    assert any(a.target != b.target for a, b in zip(old, new))
    for a, b in zip(old, new):  # the same truth, the same fields in another order: the same reward and metrics
        assert score_p(a.prompt, b.target, a.analysis) == score_p(a.prompt, a.target, a.analysis)
        assert p_metrics(a, b.target) == p_metrics(a, a.target)
    # shuffled again: a permutation drawn from each position, the same bytes on every run
    assert cli.main(["data", "render", "--data", str(best), "--out", str(again), "--order", "shuffled"]) == 0
    redone = tmp_path / "redone"
    assert cli.main(["data", "render", "--data", str(best), "--out", str(redone), "--order", "shuffled"]) == 0
    assert [p.read_bytes() for p in sorted(again.glob("shard-*"))] == \
        [p.read_bytes() for p in sorted(redone.glob("shard-*"))]
    assert any(parse_p_completion(s.target).moves != list(s.analysis.moves) for s in _p_targets(again))
    capsys.readouterr()
    assert cli.main(["data", "render", "--data", str(best), "--out", str(again), "--order", "shuffled"]) == 2
    assert "is not empty" in one_error_line(capsys)


@pytest.mark.stockfish
def test_render_keeps_the_records_of_the_tasks_named(shuffled, tmp_path, capsys):
    arbiter = tmp_path / "arbiter"
    assert cli.main(["data", "render", "--data", str(shuffled), "--out", str(arbiter), "--tasks", "A"]) == 0
    assert "rendered {'A': 10}" in capsys.readouterr().out
    kept = _records(arbiter)
    assert kept == [r for r in _records(shuffled) if r["t"] == "A"] and len(kept) == 10
    manifest = json.loads((arbiter / "manifest.json").read_text())
    assert manifest["tasks"] == ["A"] and manifest["command"].endswith("--tasks A")
    assert manifest["counts"]["task"] == {"A": 10} and sum(manifest["counts"]["split"]["train"].values()) <= 10
    assert load_files(arbiter, "all").samples == [s for s in load_files(shuffled, "all").samples if s.task == "A"]
    # both tasks: every record, the counts the source's manifest gives
    both = tmp_path / "both"
    assert cli.main(["data", "render", "--data", str(shuffled), "--out", str(both), "--tasks", "P,A"]) == 0
    assert [{k: v for k, v in r.items() if k != "s"} for r in _records(both)] == \
        [{k: v for k, v in r.items() if k != "s"} for r in _records(shuffled)]
    assert json.loads((both / "manifest.json").read_text())["counts"] == \
        json.loads((shuffled / "manifest.json").read_text())["counts"]
    capsys.readouterr()
    assert cli.main(["data", "render", "--data", str(arbiter), "--out", str(tmp_path / "none"), "--tasks", "P"]) == 2
    assert "holds no P records; choose other --tasks" in one_error_line(capsys)
    assert cli.main(["data", "render", "--data", str(shuffled), "--out", str(tmp_path / "x"), "--tasks", "B"]) == 2
    assert "--tasks 'B': name one or both of P, A" in one_error_line(capsys)


def test_render_refuses_what_is_not_generated_data_and_a_bad_order(tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    assert cli.main(["data", "render", "--data", str(tmp_path / "plain"), "--out", str(tmp_path / "o")]) == 2
    assert "is not a `rookworld data generate` directory" in one_error_line(capsys)
    assert cli.main(["data", "render", "--data", str(tmp_path / "plain"), "--out", str(tmp_path / "o"),
                     "--order", "sorted"]) == 2
    assert "--order 'sorted'" in one_error_line(capsys)
