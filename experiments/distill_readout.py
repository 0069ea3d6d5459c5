"""Rejection-sampled self-distillation of the first-candidate readout: SFT data whose P targets list the model's
own readout move first and name it after `B:`, kept where the engine's label lists that move among its five.

For each P position of the seed-0 self-play set (`make selfplay-data`, the embedded set's training side when this
was measured) the model's readout move (readout.py) is read; where it is one of the label's five candidates, the
target lists it first, then the label's other four in their ranking, each with its label eval, and names it after
`B:` (a best-first record, so greedy decoding learns to write the model's own sequence-level choice first). Other
positions are left out. No engine runs: the labels are the stored ones. The A records of the shards read are copied
as they are, and the embedded eval side beside them, so `rookworld sft --data OUT` trains on these P targets and
reports its held-out metrics on the usual split.

    python experiments/distill_readout.py --model src/rookworld/assets/model --out runs/rd-data \
        [--positions 10000] [--threads 2]
    rookworld sft --init-from src/rookworld/assets/model --data runs/rd-data --steps 300 ...
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import chess

from rookworld.data import store
from rookworld.data.relabel import read_records
from rookworld.data.sources import embedded_path
from rookworld.player import ModelPlayer
from rookworld.readout import best_first_candidate, first_candidate_scores

BATCH = 64


def readout_first(record: dict, move: str) -> dict | None:
    """The record with `move` moved to the front of its ranked candidates (best-first display, so `B:` names it),
    or None when `move` is not one of them."""
    if move not in record["m"]:
        return None
    lines = sorted(zip(record["m"], record["e"]), key=lambda line: line[0] != move)  # stable: the rest keep their rank
    return {**record, "m": [m for m, _ in lines], "e": [e for _, e in lines], "s": list(range(len(lines)))}


def distilled(player: ModelPlayer, records: list[dict]) -> list[dict | None]:
    """Each P record with the model's readout move first (None where that move is not among its candidates)."""
    boards = [chess.Board(r["fen"]) for r in records]
    scores = first_candidate_scores(player.model, player.tokenizer, boards)
    return [readout_first(r, best_first_candidate(s).uci()) for r, s in zip(records, scores)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--out", required=True, help="new data directory (train/ and eval/)")
    parser.add_argument("--source", default="runs/embedded-data/selfplay",
                        help="generated data whose P records to distill (default: `make selfplay-data`)")
    parser.add_argument("--positions", type=int, default=None, help="the first N P records of the source")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    player = ModelPlayer.load(args.model, threads=args.threads)
    out = Path(args.out)
    (out / "train").mkdir(parents=True)
    shutil.copytree(embedded_path() / "eval", out / "eval")
    kept = seen = 0
    for shard in sorted(Path(args.source).glob("shard-*.jsonl.gz")):
        records = read_records(shard)
        p_rows = [r for r in records if r["t"] == "P"]
        if args.positions is not None:
            p_rows = p_rows[:args.positions - seen]
        made = []
        for start in range(0, len(p_rows), BATCH):
            made += distilled(player, p_rows[start:start + BATCH])
        seen += len(p_rows)
        kept += sum(m is not None for m in made)
        store.write_jsonl_gz(out / "train" / shard.name,
                             [m for m in made if m is not None] + [r for r in records if r["t"] != "P"])
        print(f"{shard.name}: {seen} P positions, {kept} kept", flush=True)
        if args.positions is not None and seen >= args.positions:
            break


if __name__ == "__main__":
    main()
