"""`rookworld data generate` end to end with the real engine: labels, mix, manifest, byte-identical
reruns, resume after an interruption, PGN input, game ids and the split by game, and `data stats` /
`data export` on the result."""

import gzip
import json
import shutil
from collections import Counter

import chess
import chess.pgn
import numpy as np
import pytest
from conftest import one_error_line

from rookworld import arbiter, cli, text
from rookworld.data.cases import mating_moves
from rookworld.data.generate import PROGRESS, GenerateConfig, generate, shard_name
from rookworld.data.position import position_key
from rookworld.data.selfplay import SelfPlayConfig, play_games, random_opening
from rookworld.data.sources import load_files
from rookworld.data.splits import game_fraction, sample_split, split_of
from rookworld.data.stats import tally
from rookworld.data.synthetic import RECIPES
from rookworld.errors import UserError

pytestmark = pytest.mark.stockfish

TINY = dict(p_positions=8, a_samples=30, seed=11, depth=2, selfplay_nodes=100, shard_size=20, processes=2)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "data"
    return out, generate(GenerateConfig(out=str(out), **TINY))


def _data_bytes(out):
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*.jsonl.gz"))}


def _records(out):
    return [json.loads(line) for path in sorted(out.glob("shard-*.jsonl.gz"))
            for line in gzip.open(path, "rt").read().splitlines()]


def _game_positions(games):
    """{position key of every position before a move} of each game (chess.pgn games)."""
    positions = []
    for game in games:
        board = game.board()
        keys = set()
        for move in game.mainline_moves():
            keys.add(position_key(board.fen()))
            board.push(move)
        positions.append(keys)
    return positions


def _read_pgns(paths):
    games = []
    for path in paths:
        with open(path) as handle:
            while (game := chess.pgn.read_game(handle)) is not None:
                games.append(game)
    return games


def test_generation_labels_p_with_stockfish_rank_1_and_a_with_the_arbiter(generated):
    out, manifest = generated
    samples = load_files(out, "all").samples
    p_samples = [s for s in samples if s.task == "P"]
    a_samples = [s for s in samples if s.task == "A"]
    assert (len(p_samples), len(a_samples)) == (8, 30)
    assert len({position_key(s.fen) for s in p_samples}) == 8
    for sample in p_samples:
        analysis = sample.analysis
        assert analysis.limit == "depth=2" and list(analysis.evals) == sorted(analysis.evals, reverse=True)
        board = chess.Board(analysis.fen)
        assert len(analysis.moves) == min(5, board.legal_moves.count())
        parsed = text.parse_p_line(sample.prompt + sample.target)
        assert not parsed.errors and parsed.best == analysis.moves[0]  # B: is rank 1, for black too
        assert sorted(parsed.moves) == sorted(analysis.moves)
        assert dict(zip(parsed.moves, parsed.evals)) == {m: round(e, 2) for m, e in zip(analysis.moves, analysis.evals)}
    for sample in a_samples:
        assert sample.target == arbiter.a_target(arbiter.transition_for_prompt(sample.prompt))
    assert manifest["counts"]["task"] == {"A": 30, "P": 8}
    assert sum(manifest["counts"]["case"].values()) == 30 and manifest["counts"]["case"]["illegal"] >= 2
    assert manifest["stockfish"]["engine"].startswith("Stockfish")
    assert manifest["stockfish"]["label_limit"] == "depth=2" and manifest["stockfish"]["multipv"] == 5
    assert manifest["seed"] == 11 and "--seed 11" in manifest["command"] and manifest["created"]
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_the_same_seed_gives_byte_identical_data(generated, tmp_path):
    out, _ = generated
    again = tmp_path / "again"
    generate(GenerateConfig(out=str(again), **{**TINY, "processes": 1}))
    assert _data_bytes(again) == _data_bytes(out) and len(_data_bytes(out)) == 2


def test_other_settings_in_a_used_directory_are_refused(generated, tmp_path):
    out, _ = generated
    with pytest.raises(UserError, match="other settings"):
        generate(GenerateConfig(out=str(out), **{**TINY, "seed": 12}))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(UserError, match="not a generation or relabelling directory"):
        generate(GenerateConfig(out=str(tmp_path / "other"), **TINY))


def _write_pgn(path, seed, games):
    rng = np.random.default_rng(seed)
    with open(path, "w") as handle:
        for _ in range(games):
            board = chess.Board()
            while not board.is_game_over() and board.ply() < 90:
                moves = list(board.legal_moves)
                board.push(moves[int(rng.integers(len(moves)))])
            print(chess.pgn.Game.from_board(board), file=handle, end="\n\n")
    return path


def test_pgn_generation_resumes_after_an_interruption_and_feeds_stats_and_export(tmp_path, capsys):
    pgns = [_write_pgn(tmp_path / "a.pgn", 1, 3), _write_pgn(tmp_path / "b.pgn", 2, 3)]
    out = tmp_path / "data"
    args = ["data", "generate", "--out", str(out), "--p-positions", "12", "--a-samples", "40", "--seed", "5",
            "--depth", "2", "--shard-size", "26", "--processes", "2", "--pgn", *map(str, pgns)]
    assert cli.main(args) == 0
    finished = _data_bytes(out)
    assert len(finished) == 2

    # every P position comes from the PGN games, and from the game its id names: game k of shard s is the
    # (2s + k)-th game of the files (2 games per shard); A samples with an id ask about a position of it
    per_game = _game_positions(_read_pgns(pgns))
    records = _records(out)
    samples = load_files(out, "all").samples
    assert [s.meta.get("game") for s in samples] == [r.get("g") for r in records]
    assert all(s.meta["game"] for s in samples if s.task == "P")
    for sample in samples:
        if sample.meta.get("game") is not None:
            seed, shard, game = map(int, sample.meta["game"].split("-"))
            assert seed == 5 and position_key(sample.fen) in per_game[2 * shard + game]
        else:  # only samples not made from a game position lack an id
            assert sample.task == "A" and sample.meta["case"] in {*RECIPES, "en_passant", "first_move"}
    assert len({s.meta["game"] for s in samples if "game" in s.meta}) == 4

    # an interruption after the first shard: the second shard is missing from disk and from progress.json
    progress = json.loads((out / PROGRESS).read_text())
    del progress["shards"]["1"]
    (out / PROGRESS).write_text(json.dumps(progress))
    (out / shard_name(1)).unlink()
    (out / "manifest.json").unlink()
    assert cli.main(args) == 0
    assert _data_bytes(out) == finished and _records(out) == records  # game ids included
    assert json.loads((out / "manifest.json").read_text())["games"] == 4  # 2 per shard, read on after resume

    capsys.readouterr()
    assert cli.main(["data", "stats", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "illegal" in shown and "phase" in shown and "rows read: 52 in the split, 0 in the other" in shown
    assert "eval, position in train" in shown
    target = tmp_path / "train.jsonl"
    assert cli.main(["data", "export", "--source", str(out), "--split", "train", "--out", str(target)]) == 0
    exported = load_files(target, "all").samples
    assert [s.prompt for s in exported] == [s.prompt for s in load_files(out, "train").samples]
    assert all(sample_split(s) == "train" for s in exported)  # the game id travels with the export
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(exported) == sum(manifest["counts"]["split"]["train"].values())


def test_copied_generation_directory_is_complete_and_rerun_is_a_no_op(generated, tmp_path):
    out, manifest = generated
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    again = generate(GenerateConfig(out=str(copy), **TINY))
    assert _data_bytes(copy) == _data_bytes(out) and again["counts"] == manifest["counts"]



def test_every_sample_of_one_game_is_on_one_side(generated):
    out, manifest = generated
    records = _records(out)
    assert all("g" in r for r in records if r["t"] == "P")
    assert all(r["c"] in {*RECIPES, "en_passant", "first_move"} for r in records if "g" not in r)
    train = load_files(out, "train", eval_fraction=0.5).samples  # 0.5: both sides get games here
    held_out = load_files(out, "eval", eval_fraction=0.5).samples
    train_games = {s.meta["game"] for s in train if "game" in s.meta}
    eval_games = {s.meta["game"] for s in held_out if "game" in s.meta}
    assert train_games and eval_games and not train_games & eval_games
    assert all(game_fraction(g) >= 0.5 for g in train_games) and all(game_fraction(g) < 0.5 for g in eval_games)
    assert all(split_of(s.fen, 0.5) == "train" for s in train if "game" not in s.meta)  # no id: by position
    assert all(split_of(s.fen, 0.5) == "eval" for s in held_out if "game" not in s.meta)
    counts = tally(train + held_out, 0.5)
    assert counts["split"] == {"eval": Counter(s.task for s in held_out), "train": Counter(s.task for s in train)}
    train_keys = {position_key(s.fen) for s in train}
    assert counts["eval_positions_in_train"] == {t: sum(s.task == t and position_key(s.fen) in train_keys
                                                        for s in held_out) for t in ("A", "P")}
    # the manifest counts with the loader's rule (decided on the stored records, before decoding)
    assert manifest["counts"]["split"]["train"] == Counter(s.task for s in load_files(out, "train").samples)
    assert set(manifest["counts"]["eval_positions_in_train"]) == {"A", "P"}


@pytest.mark.parametrize("side", ["eval", "train"])
def test_side_makes_only_that_side_of_the_split_by_game(side, tmp_path, capsys):
    out = tmp_path / side
    args = ["data", "generate", "--out", str(out), "--p-positions", "8", "--a-samples", "60", "--seed", "3",
            "--depth", "2", "--selfplay-nodes", "100", "--shard-size", "40", "--processes", "2", "--side", side]
    assert cli.main(args) == 0
    other = "train" if side == "eval" else "eval"
    samples = load_files(out, "all").samples
    assert Counter(s.task for s in samples) == {"P": 8, "A": 60}
    assert all(sample_split(s) == side for s in samples)
    with pytest.raises(UserError, match=f"68 usable rows but none in the {other} split"):
        load_files(out, other)
    # ids of the other side are skipped, not played: on the eval side (5% of ids) the indices are sparse
    indices = sorted({int(s.meta["game"].split("-")[2]) for s in samples if "game" in s.meta})
    assert (max(indices) >= 5 * len(indices)) == (side == "eval")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["side"] == side and manifest["command"].endswith(f"--side {side}")
    assert manifest["counts"]["split"] == {side: {"P": 8, "A": 60}}
    rates, seconds = manifest["samples_per_second"], manifest["seconds"]  # None: too fast to time (depth 2)
    assert (rates["P"] is None) == (seconds["label"] < 0.1) and (rates["P"] or 0) < 1e5
    assert cli.main([*args[:-1], "both"]) == 2
    assert "--side 'both': choose one of train, eval, all" in capsys.readouterr().err


def test_p_select_mate_in_one_keeps_only_positions_with_a_mate(tmp_path):
    out = tmp_path / "mates"
    manifest = generate(GenerateConfig(out=str(out), p_positions=4, a_samples=0, seed=5, depth=2, selfplay_nodes=100,
                                       processes=2, p_select="mate-in-one"))
    samples = load_files(out, "all").samples
    assert [s.task for s in samples] == ["P"] * 4
    assert all(mating_moves(chess.Board(s.fen)) for s in samples)
    assert manifest["command"].endswith("--p-select mate-in-one")


def test_weaker_play_longer_openings_and_checks_shape_the_games_and_positions(tmp_path):
    # every move random: no engine search is needed at all, so no pool is given
    rng = np.random.default_rng(0)
    random_games = play_games(None, 6, rng, SelfPlayConfig(random_move_rate=1.0, max_plies=40))
    assert all(len(game.moves) >= 20 for game in random_games)  # random games rarely end before 40 plies
    openings = [len(list(random_opening(np.random.default_rng(i), SelfPlayConfig(max_random_plies=30)).move_stack))
                for i in range(40)]
    assert min(openings) >= 2 and max(openings) > 8 and max(openings) <= 30
    # positions in check: all kept as P candidates, or none
    common = dict(p_positions=60, a_samples=0, seed=4, depth=2, selfplay_nodes=100, processes=2, max_opening_plies=12,
                  random_move_rate=0.3)
    checks = {}
    for keep in (0.0, 1.0):
        out = tmp_path / f"keep{keep}"
        manifest = generate(GenerateConfig(out=str(out), p_keep_check=keep, **common))
        checks[keep] = sum(chess.Board(s.fen).is_check() for s in load_files(out, "all").samples)
        assert f"--p-keep-check {keep}" in manifest["command"] and "--random-move-rate 0.3" in manifest["command"]
        assert manifest["stockfish"]["selfplay_random_move_rate"] == 0.3
    assert checks[0.0] == 0 and checks[1.0] > 0


def test_the_mate_in_one_fixture_is_what_its_manifest_says(fixtures_dir):
    found = load_files(fixtures_dir / "mate_in_one", "all")
    manifest = json.loads((fixtures_dir / "mate_in_one" / "manifest.json").read_text())
    assert len(found.samples) == manifest["counts"]["task"]["P"] == 300
    assert "--p-select mate-in-one" in manifest["command"] and manifest["stockfish"]["label_limit"] == "depth=10"
    assert all(mating_moves(chess.Board(s.fen)) for s in found.samples)


def test_missing_or_empty_pgn_files_and_a_file_as_out_are_refused_before_any_work(tmp_path, capsys):
    args = ["data", "generate", "--p-positions", "5", "--a-samples", "10", "--processes", "1"]
    out, missing = tmp_path / "out", tmp_path / "missing.pgn"
    assert cli.main([*args, "--out", str(out), "--pgn", str(missing)]) == 2
    assert f"--pgn {missing}: not an existing file" in one_error_line(capsys)
    empty, notes = tmp_path / "empty.pgn", tmp_path / "notes.pgn"
    empty.write_text("")
    notes.write_text("these are notes, not games\n")
    assert cli.main([*args, "--out", str(out), "--pgn", str(empty), str(notes)]) == 2
    assert f"--pgn {empty} {notes}: no standard chess game with moves" in one_error_line(capsys)
    assert not out.exists()  # no shard written, nothing recorded as done
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert cli.main([*args, "--out", str(a_file)]) == 2
    assert f"--out {a_file}: {a_file} is a file, not a directory" in one_error_line(capsys)


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "-1"], "--temperature finite and >= 0; got 4000, 1000, -1.0"),
    (["--seed", "-1"], "--seed -1: must be >= 0"),
    (["--p-select", "mates"], "--p-select 'mates': choose one of any, mate-in-one"),
    (["--random-move-rate", "1.5"], "--random-move-rate and --p-keep-check are chances from 0 to 1; got 1.5, 0.4"),
    (["--p-keep-check", "-0.1"], "--random-move-rate and --p-keep-check are chances from 0 to 1; got 0.0, -0.1"),
    (["--max-opening-plies", "1"], "--max-opening-plies 1: must be >= 2"),
    (["--order", "ranked"], "--order 'ranked': choose one of shuffled, best-first"),
])
def test_bad_generate_flags_are_one_clear_line(flags, message, tmp_path, capsys):
    assert cli.main(["data", "generate", "--out", str(tmp_path / "out"), "--p-positions", "2", *flags]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "out").exists()
