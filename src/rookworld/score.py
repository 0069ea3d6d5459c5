"""`rookworld score --input in.jsonl --output out.jsonl`: score completions of P and A prompts.

Each input line is a JSON object with `prompt` and `completion`, and optionally `analysis` (the
stored Stockfish truth of a P prompt, as Analysis.to_json() writes it). Each output line repeats the
input object and adds `task`, `reward`, `components` and, for A prompts, `target` (the exact expected
completion). A line that cannot be scored gets an `error` field instead; output order is input order.
Stockfish starts only when a batch needs it: a P line without analysis, or a move outside it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rookworld import arbiter, rewards, text
from rookworld.analysis import Analysis, legal_analysis
from rookworld.config import add_config_arguments, build_config
from rookworld.errors import InvalidPromptError, UserError
from rookworld.fsutil import output_file

if TYPE_CHECKING:
    from rookworld.stockfish import StockfishPool


@dataclass
class ScoreConfig:
    input: str = field(default="", metadata={"help": "JSONL file, one {prompt, completion[, analysis]} per line"})
    output: str = field(default="", metadata={"help": "JSONL file to write, one scored line per input line"})
    processes: int | None = field(default=None, metadata={"help": "Stockfish processes, one per CPU core when unset"})
    stockfish: str | None = field(default=None, metadata={
        "help": "Stockfish binary; when unset: $ROOKWORLD_STOCKFISH, then PATH, then /usr/games/stockfish"})
    cache: str | None = field(default=None, metadata={"help": "SQLite file caching Stockfish results across runs"})
    batch_size: int = field(default=256, metadata={"help": "lines scored together in one engine batch"})

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.processes is not None and self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, ScoreConfig)
    add_config_arguments(parser, rewards.RewardConfig)  # the same reward flags as `rookworld train`


@dataclass
class _Line:
    """One input line on its way out: the output record and what scoring needs (not `ok` once it has an error)."""

    record: dict[str, Any]
    prompt: str = ""
    completion: str = ""
    analysis: Analysis | None = None
    transition: arbiter.Transition | None = None

    @property
    def ok(self) -> bool:
        return "error" not in self.record


def _read_line(number: int, raw: str) -> _Line:
    """Parse and check one input line; problems become an `error` field, never an exception."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        return _Line({"line": number, "input": raw[:200], "error": f"line {number} is not JSON: {exc}"})
    if not isinstance(record, dict):
        return _Line({"line": number, "input": record, "error": f"line {number} is not a JSON object"})
    line = _Line(record)
    prompt, completion = record.get("prompt"), record.get("completion")
    if not isinstance(prompt, str) or not isinstance(completion, str):
        record["error"] = f"line {number} needs the string fields 'prompt' and 'completion'"
        return line
    line.prompt, line.completion = prompt, completion
    task = text.task_of(prompt)
    if task == "P" and record.get("analysis") is not None:
        try:
            line.analysis = legal_analysis(Analysis.from_json(record["analysis"]))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            record["error"] = f"line {number}: 'analysis' is not a usable Analysis.to_json() object: {exc}"
            return line
    try:
        if task == "P" and line.analysis is not None:
            rewards.uncovered_moves(prompt, completion, line.analysis)  # checks that prompt and analysis agree
        elif task == "P":
            rewards.p_board(prompt)
        elif task == "A":
            line.transition = arbiter.transition_for_prompt(prompt)
        else:
            raise InvalidPromptError(f"prompt must start with {text.P_PREFIX!r} or {text.A_PREFIX!r}: {prompt[:100]!r}")
    except ValueError as exc:  # InvalidPromptError, or an analysis of another position
        record["error"] = f"line {number}: {exc}"
        return line
    record["task"] = task
    return line


class _LazyPool:
    """The Stockfish pool, started on first use: A lines and fully covered P lines never need it."""

    def __init__(self, cfg: ScoreConfig, stack: ExitStack) -> None:
        self._cfg, self._stack, self._pool = cfg, stack, None

    def get(self) -> StockfishPool:
        if self._pool is None:
            from rookworld.stockfish import StockfishPool

            self._pool = self._stack.enter_context(StockfishPool(
                processes=self._cfg.processes, binary=self._cfg.stockfish, cache_path=self._cfg.cache))
        return self._pool


def _score_batch(lines: list[_Line], pool: _LazyPool, reward_cfg: rewards.RewardConfig) -> None:
    """Add reward, components (and target) to each good line; P lines go through the engine together."""
    items = [(line.prompt, line.completion, line.analysis) for line in lines if line.ok and line.transition is None]
    p_scores = iter(rewards.score_batch(items, pool.get() if rewards.needs_engine(items) else None, reward_cfg))
    for line in lines:
        if not line.ok:
            continue
        if line.transition is not None:
            line.record["target"] = arbiter.a_target(line.transition)
            score = rewards.score_a(line.prompt, line.completion, line.transition)
        else:
            score = next(p_scores)
        line.record["reward"] = score.reward
        line.record["components"] = score.components


def _progress() -> Progress:
    return Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[rate]:.0f} lines/s"), console=Console(stderr=True))


def run(args: argparse.Namespace) -> int:
    cfg = build_config(ScoreConfig, args)
    reward_cfg = build_config(rewards.RewardConfig, args)
    if not cfg.input or not cfg.output:
        raise UserError("rookworld score needs --input IN.jsonl and --output OUT.jsonl")
    source, target = Path(cfg.input), Path(cfg.output)
    if not source.is_file():
        raise UserError(f"input file not found: {source} (give a JSONL file of prompt/completion lines)")
    output_file(target, "--output")
    with source.open(encoding="utf-8", errors="replace") as handle:
        total = sum(1 for _ in handle)

    partial = target.with_name(target.name + ".partial")  # renamed into place only when complete
    counts = Counter()
    start = time.perf_counter()
    with ExitStack() as stack:
        pool = _LazyPool(cfg, stack)
        progress = stack.enter_context(_progress())
        bar = progress.add_task("score", total=total, rate=0.0)
        reader = stack.enter_context(source.open(encoding="utf-8", errors="replace"))
        writer = stack.enter_context(partial.open("w", encoding="utf-8"))
        stack.callback(partial.unlink, missing_ok=True)  # a no-op after the rename

        def flush(batch: list[_Line]) -> None:
            _score_batch(batch, pool, reward_cfg)
            for line in batch:
                writer.write(json.dumps(line.record, ensure_ascii=False) + "\n")
                counts[line.record["task"] if line.ok else "error"] += 1
            done = sum(counts.values())
            progress.update(bar, completed=done, rate=done / (time.perf_counter() - start))

        batch: list[_Line] = []
        for number, raw in enumerate(reader, start=1):
            batch.append(_read_line(number, raw.rstrip("\r\n")))
            if len(batch) == cfg.batch_size:
                flush(batch)
                batch = []
        if batch:
            flush(batch)
        writer.close()
        os.replace(partial, target)
    print(f"scored {counts['P']} P and {counts['A']} A lines ({counts['error']} errors) -> {target}")
    return 0
