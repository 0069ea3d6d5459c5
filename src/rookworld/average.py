"""`rookworld average`: the mean of several checkpoints' weights (a uniform model soup, Wortsman et al. 2022).

Meant for runs fine-tuned from one starting model with different seeds: what the runs share survives the
mean, what each run's own noise added cancels (docs/experiments.md measures it on GRPO runs).
"""

from __future__ import annotations

import argparse

import torch

from rookworld.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", required=True,
                        help="a checkpoint directory or hub id; give it two or more times")
    parser.add_argument("--out", required=True, help="directory of the averaged checkpoint")


def mean_state(states: list[dict[str, torch.Tensor]], names: list[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts of one architecture; UserError naming the first that differs."""
    first = states[0]
    for state, name in zip(states[1:], names[1:]):
        if {k: v.shape for k, v in state.items()} != {k: v.shape for k, v in first.items()}:
            raise UserError(f"{name}: its weights' names or shapes differ from {names[0]}'s; only checkpoints of "
                            f"one architecture (runs from one starting model) can be averaged")
    return {k: torch.stack([state[k] for state in states]).mean(0) for k in first}


def run(args: argparse.Namespace) -> int:
    from rookworld.hub import load_model, save_model

    if len(args.model) < 2:
        raise UserError(f"--model was given {len(args.model)} time(s): an average needs two or more checkpoints")
    models, tokenizers = zip(*(load_model(name) for name in args.model))
    for tokenizer, name in zip(tokenizers[1:], args.model[1:]):
        if tokenizer.backend.to_str() != tokenizers[0].backend.to_str():
            raise UserError(f"{name}: its tokenizer differs from {args.model[0]}'s; average checkpoints of one model")
    averaged = models[0]
    averaged.load_state_dict(mean_state([m.state_dict() for m in models], args.model))
    save_model(averaged, tokenizers[0], args.out, metadata={"averaged_from": list(args.model)})
    print(f"wrote the mean of {len(models)} checkpoints to {args.out}")
    return 0
