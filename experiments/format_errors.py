"""Why greedy P completions fail `P/format_valid`, on the P positions of the embedded set's eval split.

A completion is format-valid when it parses and lists as many `M:` candidates as the label does (five, or every legal
move where there are fewer). Each failing completion is counted once, under the first reason that applies:
`parse` (the parser's errors, or no `B:` move), `too few` (fewer candidates than the label lists) or `too many`
(more: moves that cannot all be legal). Completions are the greedy ones `rookworld eval` scores.

    python experiments/format_errors.py --model src/rookworld/assets/model [--model RUN/checkpoint-last ...] \
        [--out runs/format_errors.json] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from rookworld.data.sources import load_source
from rookworld.evaluate import EvalConfig, model_completions
from rookworld.player import ModelPlayer
from rookworld.text import parse_p_completion


def reason(completion: str, label_count: int) -> str | None:
    """Why `completion` is not format-valid against a label of `label_count` candidates (None: it is valid)."""
    parsed = parse_p_completion(completion)
    if parsed.errors or parsed.best is None:
        return "parse"
    if len(parsed.moves) < label_count:
        return "too few"
    if len(parsed.moves) > label_count:
        return "too many"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="checkpoint directory (repeatable)")
    parser.add_argument("--out", default=None, help="JSON file of the counts")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    samples = [s for s in load_source("embedded", "eval").samples if s.task == "P"]
    short = sum(len(s.analysis.top5) < 5 for s in samples)
    print(f"{len(samples)} P positions of the embedded eval split, {short} with fewer than 5 legal moves", flush=True)
    results: dict[str, dict[str, int]] = {}
    for name in args.model:
        player = ModelPlayer.load(name, threads=args.threads)
        completions = model_completions(player.model, player.tokenizer, samples, EvalConfig())
        counts = Counter(reason(group[0], len(s.analysis.top5)) for s, group in zip(samples, completions))
        results[name] = {key: counts[key] for key in ("parse", "too few", "too many")}
        failed = sum(results[name].values())
        print(f"{name}: {failed} of {len(samples)} invalid ({failed / len(samples):.3f}): "
              + ", ".join(f"{key} {n}" for key, n in results[name].items()), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
