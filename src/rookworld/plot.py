"""`rookworld plot RUN_DIR [RUN_DIR ...] [--out FILE.png] [--smooth N]`: a PNG dashboard of training runs.

Overlays reward, KL, beta, entropy, gradient norm, step time, zero-std groups, KL share and eval
metrics of each run (the panels whose metrics some run logged).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="output directory of rookworld train or sft (holds metrics.jsonl)")
    parser.add_argument("--out", default=None, metavar="FILE.png",
                        help="where to write the PNG (default: dashboard.png in the first RUN_DIR)")
    parser.add_argument("--smooth", type=int, default=1, metavar="N",
                        help="trailing moving average over N steps of the training curves (default: 1, raw)")


def run(args: argparse.Namespace) -> int:
    from rookworld.plots import dashboard

    print(dashboard(args.runs, args.out, args.smooth))
    return 0
