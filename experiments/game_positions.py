"""GRPO data whose P prompts are positions of the model's own games: the positions a match against its base reaches.

The model plays itself as a match plays it (`rookworld play --opponent model`, both sides avoiding repetitions at 1
pawn, 4 random opening plies a game); the positions of those games are labelled by Stockfish as `rookworld data
generate --pgn` labels any game (depth 10, multipv 5, best-first, every position in check kept), on the training
side of the split by game. Beside them go the embedded training side's A records (the default's A prompts) and the
embedded eval side as it is, so `rookworld train --data OUT` differs from the default only in where its P prompts
come from, and its held-out evaluation is the default's.

    python experiments/game_positions.py --model src/rookworld/assets/model --out runs/gp/data --games 300 --seed 100
    rookworld train --data runs/gp/data --seed S --out RUN
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

from rookworld.data.sources import embedded_path

ROOKWORLD = [sys.executable, "-m", "rookworld.cli"]


def run(args: list[str]) -> None:
    print("+ rookworld " + " ".join(args), flush=True)
    subprocess.run(ROOKWORLD + args, check=True)


def copy_a_records(source: Path, out: Path) -> int:
    """The A records of `source`'s shards written to `out` under the same names; returns how many."""
    out.mkdir(parents=True)
    kept = 0
    for shard in sorted(source.glob("shard-*.jsonl.gz")):
        with gzip.open(shard, "rt") as lines:
            records = [line for line in lines if json.loads(line)["t"] == "A"]
        with gzip.open(out / shard.name, "wt") as file:
            file.writelines(records)
        kept += len(records)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory whose games give the positions")
    parser.add_argument("--out", required=True, help="new data directory")
    parser.add_argument("--games", type=int, default=300, help="games the model plays against itself")
    parser.add_argument("--seed", type=int, default=100, help="seed of the games' openings and of the labelling")
    parser.add_argument("--p-positions", type=int, default=4000, help="P positions to label from the games")
    parser.add_argument("--pgn", help="use these games instead of playing them (a PGN file)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads and Stockfish processes")
    args = parser.parse_args()

    out = Path(args.out)
    if out.exists():
        sys.exit(f"--out {out}: exists; give a new directory")
    out.mkdir(parents=True)
    pgn = args.pgn or str(out / "games.pgn")
    if not args.pgn:
        run(["play", "--model", args.model, "--opponent", "model", "--opponent-model", args.model,
             "--avoid-repetition", "1", "--opponent-avoid-repetition", "1", "--games", str(args.games),
             "--seed", str(args.seed), "--threads", str(args.threads), "--pgn", pgn,
             "--out", str(out / "games.json")])
    run(["data", "generate", "--pgn", pgn, "--out", str(out / "train" / "games"), "--p-positions",
         str(args.p_positions), "--a-samples", "0", "--seed", str(args.seed), "--depth", "10", "--order",
         "best-first", "--p-keep-check", "1", "--side", "train", "--processes", str(args.threads)])
    kept = copy_a_records(embedded_path() / "train", out / "train" / "embedded-a")
    shutil.copytree(embedded_path() / "eval", out / "eval")
    print(f"{out}: {args.p_positions} P positions from the games, {kept} A records of the embedded training side, "
          "the embedded eval side")


if __name__ == "__main__":
    main()
