"""`rookworld average`: the mean of several checkpoints' weights (a uniform model soup, Wortsman et al. 2022).

Meant for runs fine-tuned from one starting model with different seeds: what the runs share survives the
mean, what each run's own noise added cancels.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from rookworld.errors import UserError

if TYPE_CHECKING:
    from rookworld.model import GPTConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", required=True,
                        help="a checkpoint directory or hub id; give it two or more times")
    parser.add_argument("--out", required=True, help="directory of the averaged checkpoint")


def check_same_config(config: GPTConfig, first: GPTConfig, name: str, first_name: str) -> None:
    """One architecture: equal configs give equal weight names and shapes, and the same model of them (heads)."""
    for f in dataclasses.fields(first):
        mine, theirs = getattr(config, f.name), getattr(first, f.name)
        if mine != theirs:
            raise UserError(f"{name}: its {f.name} is {mine}, {first_name}'s is {theirs}; only checkpoints of one "
                            f"architecture (runs from one starting model) can be averaged")


def run(args: argparse.Namespace) -> int:
    from rookworld.hub import check_model_out, load_model, save_model

    if len(args.model) < 2:
        raise UserError(f"--model was given {len(args.model)} time(s): an average needs two or more checkpoints")
    check_model_out(args.out, "--out")
    first, tokenizer = load_model(args.model[0])
    total = {k: v.clone() for k, v in first.state_dict().items()}
    for name in args.model[1:]:  # one checkpoint in memory at a time beside the sum
        model, other = load_model(name)
        # the view is the tokenizer's too: models of two views read the same boards differently
        if other.backend.to_str() != tokenizer.backend.to_str() or other.view != tokenizer.view:
            raise UserError(f"{name}: its tokenizer differs from {args.model[0]}'s; average checkpoints of one model")
        check_same_config(model.config, first.config, name, args.model[0])
        for k, v in model.state_dict().items():
            total[k] += v
    first.load_state_dict({k: v / len(args.model) for k, v in total.items()})
    save_model(first, tokenizer, args.out, metadata={"averaged_from": list(args.model)})
    print(f"wrote the mean of {len(args.model)} checkpoints to {args.out}")
    return 0
