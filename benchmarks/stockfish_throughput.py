"""`python benchmarks/stockfish_throughput.py [--positions 100] [--depth 10] [--multipv 5] [--processes 1 2]`

Positions per second of `StockfishPool.analyse` at the P-label limit, for each pool size, on real
positions (the RookWorld validation sample, then the A-task openings), with the cache off.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rookworld.stockfish import Limit, StockfishPool
from rookworld.text import parse_p_line

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def real_positions(count: int) -> list[str]:
    """Distinct FENs: middlegames and endgames from rook_val_sample.txt, then opening positions."""
    fens = [parse_p_line(line).fen for line in (FIXTURES / "rook_val_sample.txt").read_text().splitlines()]
    fens += [row["expected_fen"] for row in json.loads((FIXTURES / "a_task_openings_sample.json").read_text())]
    unique = list(dict.fromkeys(fen for fen in fens if fen))
    if len(unique) < count:
        raise SystemExit(f"only {len(unique)} distinct positions in {FIXTURES}, asked for {count}")
    return unique[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=100)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--multipv", type=int, default=5)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    fens = real_positions(args.positions)
    limit = Limit(depth=args.depth)
    rates = {}
    for processes in args.processes:
        with StockfishPool(processes=processes, cache_size=0) as pool:
            started = time.perf_counter()
            pool.analyse(fens, limit, args.multipv)
            rates[processes] = len(fens) / (time.perf_counter() - started)

    base = rates[args.processes[0]]
    print(f"{len(fens)} positions, {limit.key()}, multipv {args.multipv}")
    print("| processes | positions/s | ms/position | speed-up |")
    print("|---:|---:|---:|---:|")
    for processes, rate in rates.items():
        print(f"| {processes} | {rate:.2f} | {1000 / rate:.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
