"""Probe: does GRPO teach a model to convert won positions when its P reward sees mates?

The package's `best_move` credit compares evals clipped to 10 pawns, so in a position with a forced mate every move
that keeps a won position earns full credit: a run is never told to mate. In matches against its base a trained
model reaches many mates in one and takes few, and most games end in threefold repetition. This script changes two
things, each in its own subcommand:

- `data`: a GRPO data directory (by default the embedded set, whose P prompts are positions of the model's own games)
  plus N positions with a forced mate for the side to move, drawn from the P records of the seed-0 self-play set
  (`make selfplay-data`; rendered best-first, as the rest).
- `train`: `rookworld train` with a mate-aware credit: where the stored best move mates, a move that mates too earns
  DECAY ** (its moves to mate - the best's), and a move that gives up the mate earns KEEP times the usual credit.
  Only the run's `reward/...` figures see it: its move metrics and every later `rookworld eval` do not.

    python experiments/mate_credit.py data --mates 400 --seed 0 --out runs/mc/data
    python experiments/mate_credit.py train --data runs/mc/data --seed 0 --out RUN
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from pathlib import Path

from rookworld import cli, rewards
from rookworld.analysis import Analysis, is_mate_score, pawns_to_mate
from rookworld.data import store
from rookworld.data.relabel import read_records, read_source
from rookworld.data.sources import embedded_path

DECAY = 0.5  # credit of a mate one move slower than the best
KEEP = 0.25  # share of the usual credit a move keeps when it gives up a forced mate

usual_credit = rewards._dense_credit


def mates(pawns: float) -> bool:
    """Whether an eval is a forced mate for the side to move."""
    return pawns > 0 and is_mate_score(pawns)


def mate_aware_credit(config: rewards.RewardConfig, analysis: Analysis, move_eval: float) -> float:
    """The usual credit, except where the best stored move mates: then the speed of the move's own mate counts."""
    best = max(analysis.evals)
    if not mates(best):
        return usual_credit(config, analysis, move_eval)
    if mates(move_eval):
        return DECAY ** max(0, pawns_to_mate(move_eval) - pawns_to_mate(best))
    return KEEP * usual_credit(config, analysis, move_eval)


def mate_records(positions: Path, count: int, seed: int) -> list[dict]:
    """`count` P records of generated data whose side to move has a forced mate, rendered best-first."""
    found = [{**record, "s": list(range(len(record["m"])))} for shard in read_source(positions)[1]
             for record in read_records(shard) if record["t"] == "P" and record["e"] and mates(max(record["e"]))]
    if count > len(found):
        sys.exit(f"--mates {count}: {positions} holds {len(found)} such positions; ask for fewer")
    return random.Random(seed).sample(found, count)


def build_data(args: argparse.Namespace) -> None:
    source, out = Path(args.source), Path(args.out)
    if out.exists():
        sys.exit(f"--out {out}: exists; give a new directory")
    shutil.copytree(source / "train", out / "train")
    shutil.copytree(source / "eval", out / "eval")
    records = mate_records(Path(args.positions), args.mates, args.seed)
    (out / "train" / "mates").mkdir()
    store.write_jsonl_gz(out / "train" / "mates" / "shard-00000.jsonl.gz", records)
    mate_in_one = sum(pawns_to_mate(max(record["e"])) == 1 for record in records)
    print(f"{out}: {source}'s training and eval sides, and {len(records)} forced-mate P positions "
          f"({mate_in_one} mates in one)")


def main() -> None:
    if sys.argv[1:2] == ["train"]:
        rewards._dense_credit = mate_aware_credit
        sys.exit(cli.main(sys.argv[1:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="a data directory with forced-mate positions added")
    data.add_argument("--source", default=str(embedded_path()), help="GRPO data directory to copy (train/ and eval/); "
                      "default: the embedded set")
    data.add_argument("--positions", default="runs/embedded-data/selfplay",
                      help="generated data whose P records give the forced mates (default: `make selfplay-data`)")
    data.add_argument("--mates", type=int, default=400, help="forced-mate P positions to add")
    data.add_argument("--seed", type=int, default=0, help="seed of the positions drawn")
    data.add_argument("--out", required=True, help="new data directory")
    sub.add_parser("train", help="rookworld train with the mate-aware credit; takes rookworld train's options")
    build_data(parser.parse_args())


if __name__ == "__main__":
    main()
