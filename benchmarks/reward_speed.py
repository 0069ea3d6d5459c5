"""`python benchmarks/reward_speed.py [--calls-per-prompt 8] [--repeat 32] [--processes N]`

1. Reward speed with stored truth: milliseconds per `rewards.score_p` / `rewards.score_a` call, median
   and p90, on real positions (rook_val_sample.txt with its Stockfish labels; the A opening prompts)
   and completions as the model writes them (~120 characters: the exact target and corrupted variants),
   and the same run on to 200 characters. Like a GRPO group, each prompt is scored `--calls-per-prompt`
   times in a row (the prompt's board is cached after the first); A is timed with the stored
   transition and with the arbiter computing it.
2. `rookworld score` throughput: lines/s of the command (a fresh process, engine start included) on a
   file built from rookworld_lm_completions_k8.json repeated `--repeat` times, with a cold Stockfish
   cache and again with the warm one.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rookworld import arbiter, rewards, text
from rookworld.analysis import Analysis

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def p_cases(fixtures: Path) -> list[tuple[str, list[str], Analysis]]:
    """(prompt, completions, analysis) per validation position: the exact target, worse best move,
    drifted evals, one illegal candidate."""
    cases = []
    for line in (fixtures / "rook_val_sample.txt").read_text().splitlines():
        parsed = text.parse_p_line(line)
        ranked = sorted(zip(parsed.moves, parsed.evals), key=lambda pair: -pair[1])
        moves, evals = [m for m, _ in ranked], [e for _, e in ranked]
        analysis = Analysis(parsed.fen, tuple(moves), tuple(evals), "rook_val")
        completions = [
            text.p_target(parsed.fen, moves, evals, moves[0]),
            text.p_target(parsed.fen, moves, evals, moves[-1]),
            text.p_target(parsed.fen, moves, [e + 0.7 for e in evals], moves[0]),
            text.p_target(parsed.fen, moves[:-1] + ["a1a1"], evals, moves[0]),
        ]
        cases.append((text.p_prompt(parsed.fen), completions, analysis))
    return cases


def a_cases(fixtures: Path) -> list[tuple[str, list[str], arbiter.Transition]]:
    cases = []
    for row in json.loads((fixtures / "a_task_openings_sample.json").read_text()):
        truth = arbiter.transition_for_prompt(row["prompt"])
        target = arbiter.a_target(truth)
        fen, rest = target.split("+", 1)
        wrong_clock = fen.rsplit(" ", 1)[0] + " 99+" + rest
        cases.append((row["prompt"], [target, wrong_clock, text.parse_a_prompt(row["prompt"]).fen + "+" + rest],
                      truth))
    return cases


def timings(calls) -> list[float]:
    """Milliseconds of each (function, args) call, in order."""
    out = []
    for function, args in calls:
        start = time.perf_counter()
        function(*args)
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(name: str, ms: list[float], chars: list[int]) -> str:
    p90 = statistics.quantiles(ms, n=10)[-1]
    return (f"| {name} | {len(ms)} | {statistics.mean(chars):.0f} | {statistics.median(ms):.3f} | {p90:.3f} |")


def reward_speed(fixtures: Path, per_prompt: int, seed: int) -> None:
    rng = random.Random(seed)
    p_calls, p200_calls, a_calls, a_arbiter_calls, p_chars, p200_chars, a_chars = [], [], [], [], [], [], []
    for prompt, completions, analysis in p_cases(fixtures):
        for _ in range(per_prompt):
            completion = rng.choice(completions)
            p_calls.append((rewards.score_p, (prompt, completion, analysis)))
            p_chars.append(len(completion))
            # 200 characters: the completion runs on past B: (text the parser must skip)
            long = (completion + " " + completion)[:200]
            p200_calls.append((rewards.score_p, (prompt, long, analysis)))
            p200_chars.append(len(long))
    for prompt, completions, truth in a_cases(fixtures):
        for _ in range(per_prompt):
            completion = rng.choice(completions)
            a_calls.append((rewards.score_a, (prompt, completion, truth)))
            a_arbiter_calls.append((rewards.score_a, (prompt, completion)))
            a_chars.append(len(completion))
    timings(p_calls[:200] + a_calls[:200])  # warm up imports and code paths
    rewards._p_position.cache_clear()  # each prompt's first call pays for its board, as in training
    print("| reward | calls | mean chars | median ms | p90 ms |\n|---|---|---|---|---|")
    print(summary("P (stored analysis)", timings(p_calls), p_chars))
    print(summary("P (stored analysis), 200 characters", timings(p200_calls), p200_chars))
    print(summary("A (stored transition)", timings(a_calls), a_chars))
    print(summary("A (arbiter computes the truth)", timings(a_arbiter_calls), a_chars))


def score_throughput(fixtures: Path, repeat: int, processes: int | None) -> None:
    rows = json.loads((fixtures / "rookworld_lm_completions_k8.json").read_text())["sample_results"]
    lines = [json.dumps({"prompt": row["prompt"], "completion": completion})
             for row in rows for completion in row["completions"]] * repeat
    with tempfile.TemporaryDirectory() as tmp:
        source, cache = Path(tmp) / "in.jsonl", Path(tmp) / "cache.sqlite"
        source.write_text("\n".join(lines) + "\n")
        command = [sys.executable, "-m", "rookworld.cli", "score", "--input", str(source),
                   "--output", str(Path(tmp) / "out.jsonl"), "--cache", str(cache)]
        if processes:
            command += ["--processes", str(processes)]
        print(f"\n`rookworld score` on {len(lines)} lines (k8 fixture x {repeat}):\n")
        print("| Stockfish cache | seconds | lines/s |\n|---|---|---|")
        for label in ("cold", "warm"):
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            seconds = time.perf_counter() - start
            print(f"| {label} | {seconds:.2f} | {len(lines) / seconds:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=FIXTURES, help="the RookWorld fixture directory")
    parser.add_argument("--calls-per-prompt", type=int, default=8, help="completions scored per prompt (G)")
    parser.add_argument("--repeat", type=int, default=32, help="copies of the k8 file in the throughput input")
    parser.add_argument("--processes", type=int, default=None, help="Stockfish processes (default: CPU count)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    reward_speed(args.fixtures, args.calls_per_prompt, args.seed)
    score_throughput(args.fixtures, args.repeat, args.processes)


if __name__ == "__main__":
    main()
