"""`python benchmarks/sft_step.py [--model DIR] [--batch-size 256] [--p-fraction 0.65] [--steps 5] [--threads N]`

One `rookworld sft` step in target mode (forward, backward, gradient clipping, AdamW) on rows of the embedded data
drawn as the SFT draws them (`TrainStream`), padded two ways: all rows to the batch's longest, and each task's rows to
their own longest (`sft.by_task`, what `rookworld sft` does). Both arrangements compute the same loss; the second
pads no P row to the length of the longest A row. Each way runs one warm-up step, then --steps timed steps on the same
batches, alternating, and prints seconds per step, padded tokens per step and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rookworld import training
from rookworld.data import load_source
from rookworld.hub import load_model, resolve_default_model
from rookworld.sft import SFTConfig, TrainStream, by_task, encode_samples, fitting, optimizer_step, target_batch


def timed_step(model, optimizer, batches) -> float:
    """Seconds of one `rookworld sft` optimizer step (`sft.optimizer_step`) on `batches`."""
    start = time.perf_counter()
    optimizer_step(model, optimizer, batches, grad_clip=1.0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--p-fraction", type=float, default=0.65)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model or resolve_default_model())
    model.train()
    samples = fitting(load_source("embedded", "train").samples, tokenizer, model.config.n_positions, "embedded")
    stream = TrainStream(samples, args.p_fraction, fresh_a=0.0, seed=0)
    optimizer = training.make_optimizer(model, SFTConfig(lr=1e-9))  # a tiny rate: the weights barely move
    ways = {
        "one width": lambda drawn: [target_batch(encode_samples(tokenizer, drawn), tokenizer.eos_id)],
        "by task": lambda drawn: [target_batch(encode_samples(tokenizer, group), tokenizer.eos_id)
                                  for group in by_task(drawn)],
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    padded: dict[str, int] = {}
    for index in range(args.steps + 1):
        drawn = stream.next(args.batch_size)
        for name, rows_of in ways.items():
            batches = rows_of(drawn)
            took = timed_step(model, optimizer, batches)
            if index:  # the first step of each way warms up
                seconds[name].append(took)
            padded[name] = sum(rows.numel() for rows, _ in batches)
    print(f"sft step, {torch.get_num_threads()} threads, {args.batch_size} rows (P share {args.p_fraction}), "
          f"{model.num_parameters():,} parameters, median of {args.steps} steps:")
    for name in ways:
        print(f"  {name:10s} {statistics.median(seconds[name]):6.2f} s/step  {padded[name]:7,} padded tokens")
    ratio = statistics.median(seconds["one width"]) / statistics.median(seconds["by task"])
    print(f"  by task is {ratio:.2f}x as fast")


if __name__ == "__main__":
    main()
