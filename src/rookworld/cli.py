"""`rookworld <command> ...`: the command-line entry point.

Each command lives in its own module, which provides `add_arguments(parser)` and `run(args) -> int`;
only the chosen command's module is imported, so `rookworld score` does not load torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rookworld import __version__
from rookworld.errors import UserError

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("rookworld.data.command", "make, relabel, count and export datasets (generate, relabel, stats, export)"),
    "score": ("rookworld.score", "score completions of P and A prompts (JSONL in, JSONL out)"),
    "plot": ("rookworld.plot", "PNG dashboard of one or more runs (reward, KL, entropy, grad norm, eval metrics)"),
    "sample": ("rookworld.sample", "print a model's completions of prompts (sampled or greedy)"),
    "eval": ("rookworld.evaluate", "held-out P and A metrics of models or of given completions"),
    "sft": ("rookworld.sft", "supervised training from scratch or from a checkpoint (packed or target-only loss)"),
    "train": ("rookworld.train", "GRPO fine-tuning (default: the embedded model and dataset)"),
    "average": ("rookworld.average", "the mean of several checkpoints' weights (runs of one starting model: a soup)"),
    "sweep": ("rookworld.sweep", "hyperparameter search over train runs (Optuna; resumable, several machines)"),
    "inspect": ("rookworld.inspect_step", "one GRPO step told in full: completions, rewards, loss parts"),
    "play": ("rookworld.play", "games against random, Stockfish, itself or a model: score, Elo, ACPL, JSON + PGN"),
    "uci": ("rookworld.uci", "the model as a UCI engine on stdin/stdout, for chess GUIs and engine matches"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rookworld", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = _parser()
        parser.parse_args(argv or ["--help"])  # prints help, or the unknown-command error
        return 2
    name = argv[0]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"rookworld {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except UserError as exc:
        print(f"rookworld {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rookworld {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
