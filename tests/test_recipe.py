"""`make embedded-model` and `make embedded-data` on a tiny slice: every command the Makefile's recipe prints
(`make -n`), run in a scratch directory with its sizes cut down (600 positions labelled at depth 1 per data command,
two SFT steps of four rows per stage, a few short games).

This checks the recipes themselves: that their data commands write what the next command reads, that each SFT stage
continues the one before it, that the last stage exports a model of the shipped model's shape with its training
record, and that the embedded set is remade with the layout and split the package ships."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rookworld.hub import read_metadata
from rookworld.text import parse_p_completion

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path("src/rookworld/assets")
SMALLER = {  # appended to a command, so they override the recipe's own sizes; the first key found in a line counts
    "rookworld data generate --pgn": ["--p-positions", "60", "--depth", "1", "--processes", "1"],
    "rookworld play": ["--games", "4", "--max-plies", "60", "--threads", "1"],
    # enough games that some fall on the eval side of the split by game, which each SFT stage needs
    "rookworld data generate": ["--p-positions", "600", "--a-samples", "60", "--depth", "1", "--processes", "1"],
    "rookworld sft": ["--steps", "2", "--batch-size", "4", "--warmup-steps", "1", "--eval-every", "2",
                      "--eval-samples", "4", "--eval-loss-samples", "4", "--checkpoint-every", "2", "--threads", "1",
                      "--tensorboard", "false"],
}


def recipe(target: str) -> list[str]:
    """The shell lines `make` would run for `target`, the environment's own rookworld as the command."""
    outer = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")  # set when the tests themselves run under make
    env = {k: v for k, v in os.environ.items() if k not in outer}
    printed = subprocess.run(["make", "-n", "--no-print-directory", "-o", "setup", "-o", "stockfish",
                              f"BIN={Path(sys.executable).parent}", target], cwd=ROOT, env=env, capture_output=True,
                             text=True, check=True)
    return printed.stdout.splitlines()


def smaller(line: str) -> str:
    for command, flags in SMALLER.items():
        if command in line:
            return f"{line} {' '.join(flags)}"
    return line


def run_recipe(target: str, where: Path) -> list[str]:
    """Runs the smaller recipe of `target` in `where`; returns its lines."""
    lines = recipe(target)
    for line in lines:
        done = subprocess.run(["bash", "-c", smaller(line)], cwd=where, capture_output=True, text=True,
                              env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/games",
                                   "HF_HUB_OFFLINE": "1", "HOME": str(where)})
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
    return lines


@pytest.mark.integration
@pytest.mark.stockfish
def test_the_embedded_data_recipe_runs_end_to_end_on_a_tiny_slice(tmp_path):
    from rookworld.data.sources import load_files
    from rookworld.data.splits import sample_split

    shutil.copytree(ROOT / ASSETS / "model", tmp_path / ASSETS / "model")
    run_recipe("embedded-data", tmp_path)
    data = tmp_path / ASSETS / "data"
    parts = sorted(str(p.parent.relative_to(data)) for p in data.rglob("manifest.json"))
    assert parts == sorted(str(p.parent.relative_to(ROOT / ASSETS / "data"))
                           for p in (ROOT / ASSETS / "data").rglob("manifest.json"))
    samples = load_files(data, "all").samples
    origin = {(sample_split(s), s.task, s.meta["game"].split("-")[0]) for s in samples if "game" in s.meta}
    # the eval side: self-play of seed 2; the training side: A of seed-0 self-play, P of the model's games (seed 100)
    assert origin == {("eval", "P", "2"), ("eval", "A", "2"), ("train", "A", "0"), ("train", "P", "100")}
    games = [s for s in samples if s.meta.get("game", "").startswith("100-")]
    assert len(games) == 60 and all(parse_p_completion(s.target).moves == list(s.analysis.moves) for s in games)


@pytest.mark.integration
@pytest.mark.stockfish
def test_the_embedded_model_recipe_runs_end_to_end_on_a_tiny_slice(tmp_path):
    shutil.copytree(ROOT / ASSETS / "data", tmp_path / ASSETS / "data")
    for config in (ROOT / ASSETS).glob("sft_*.toml"):
        shutil.copy(config, tmp_path / ASSETS / config.name)
    lines = run_recipe("embedded-model", tmp_path)
    assert sum("rookworld sft --config" in line for line in lines) >= 1

    made, shipped = tmp_path / ASSETS / "model", ROOT / ASSETS / "model"
    shape = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
    made_config, shipped_config = (json.loads((d / "config.json").read_text()) for d in (made, shipped))
    assert {k: made_config[k] for k in shape} == {k: shipped_config[k] for k in shape}
    record, stages = read_metadata(made), 0
    while record is not None:  # each stage's record holds the one it continued, down to the first
        assert record["trained_tokens"] > 0 and record["metrics"]["eval/loss"] > 0
        assert (tmp_path / record["data"]["source"]).is_dir()
        record, stages = record.get("init_from_record"), stages + 1
    assert stages == sum("rookworld sft --config" in line for line in lines)
