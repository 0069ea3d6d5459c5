"""Run logging: metric and sample files, TensorBoard, optional Weights & Biases, console progress.

Used by `rookworld train` and `rookworld sft`. Files under the run directory OUT:

    config.json      the run's configuration
    metrics.jsonl    one line per step: {"step": N, "reward/mean": ..., ...}
    eval.jsonl       one line per evaluation: {"step": N, "eval/A/exact": ..., ...}
    samples.jsonl    a few sampled completions per step: {"step": N, "prompt": ..., ...}
    tensorboard/     the same scalars, same slash names

JSON has no NaN or infinity: non-finite floats are written as null. Only rank 0 writes anything. A full disk
(or quota) is one UserError saying how to go on, as for a checkpoint save (checkpoint.disk_full_error).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from rookworld.errors import UserError
from rookworld.fsutil import disk_full, jsonable

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
SAMPLES_FILE = "samples.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_run_id.txt"


def metric_values(metrics: Mapping[str, Any]) -> dict[str, int | float]:
    """Metrics as plain Python ints/floats; a TypeError names a key whose value is not a real number.

    Tensors are refused rather than converted: a hidden `.item()` would be a hidden device sync.
    """
    values: dict[str, int | float] = {}
    for key, value in metrics.items():
        if key == "step":
            raise ValueError("'step' is not a metric: pass it as the step argument")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"metric {key!r} must be an int or float, got {type(value).__name__}"
                            " (call .item() on a 0-d tensor)")
        values[key] = int(value) if isinstance(value, numbers.Integral) else float(value)
    return values


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file. A cut-off last line (a crash mid-write) is skipped;
    a bad line anywhere else is a UserError naming the file and line."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise UserError(f"{path}:{number} is not valid JSON ({exc}); fix or delete that line") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number} is not a JSON object; fix or delete that line")
        records.append(record)
    return records


def _write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(jsonable(value), indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _truncate_after(path: Path, step: int) -> None:
    """Keep only the records of `path` with step <= `step`: the steps after it will be logged again."""
    if not path.exists():
        return
    kept = [r for r in read_records(path) if int(r.get("step", 0)) <= step]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in kept:
            handle.write(json.dumps(record) + "\n")
    os.replace(tmp, path)


def _config_dict(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config)


def _hush_tensorboard_full_disk() -> None:
    """Python prints what a thread raises, and TensorBoard's writer thread re-raises a write that failed: a full
    disk there is told once instead, by RunLogger, which meets the same error at its next TensorBoard call."""
    shown = threading.excepthook
    if getattr(shown, "hushes_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        from_tensorboard = type(args.thread).__module__.startswith("tensorboard.")
        if not (from_tensorboard and args.exc_value is not None and disk_full(args.exc_value)):
            shown(args)

    hook.hushes_tensorboard = True
    threading.excepthook = hook


class RunLogger:
    """Writes a run's config, per-step metrics, eval metrics and samples (see the module docstring).

    resume_step: the step of the checkpoint a resumed run starts from; records after it are dropped
    from the JSONL files (and purged from TensorBoard) so the re-run steps are not logged twice.
    Without it, a run directory that already has records is refused: two runs would mix. Unless
    start_over: the caller has made sure that they are of a run that cannot be resumed (it saved no
    checkpoint), and they are replaced, as a resume from before step 0 would drop them all.
    """

    def __init__(self, out_dir: str | Path, config: Mapping[str, Any] | Any, *, tensorboard: bool = True,
                 wandb_project: str | None = None, wandb_run_name: str | None = None, rank: int = 0,
                 resume_step: int | None = None, start_over: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.enabled = rank == 0
        self._files: dict[str, IO[str]] = {}
        self._tensorboard = None
        self._wandb = None
        if not self.enabled:
            return
        with self._saving(self.out_dir):
            self.out_dir.mkdir(parents=True, exist_ok=True)
            records = [self.out_dir / name for name in (METRICS_FILE, EVAL_FILE, SAMPLES_FILE)]
            found = [path for path in records if path.exists() and path.stat().st_size > 0]
            purge_step = None
            if resume_step is not None:
                for path in records:
                    _truncate_after(path, resume_step)
                purge_step = resume_step + 1
            elif found and not start_over:
                raise UserError(f"{self.out_dir} already holds a run's records ({found[0]}); resume it or choose "
                                "another output directory")
            elif found:
                print(f"{self.out_dir}: its run saved no checkpoint to resume; starting it over (its logs are "
                      "replaced)", file=sys.stderr)
                shutil.rmtree(self.out_dir / TENSORBOARD_DIR, ignore_errors=True)
            config_values = _config_dict(config)
            _write_json_atomic(self.out_dir / CONFIG_FILE, config_values)
            mode = "w" if resume_step is None else "a"  # a new run replaces what start_over allowed
            for path in records:
                self._files[path.name] = open(path, mode, encoding="utf-8")  # noqa: SIM115 (closed by close())
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                _hush_tensorboard_full_disk()
                self._tensorboard = SummaryWriter(str(self.out_dir / TENSORBOARD_DIR), purge_step=purge_step)
        if wandb_project:
            self._wandb = self._start_wandb(wandb_project, wandb_run_name, config_values)

    def _start_wandb(self, project: str, run_name: str | None, config: dict[str, Any]) -> Any:
        try:
            import wandb
        except ImportError:
            raise UserError(f"Weights & Biases logging was asked for (project {project!r}) but the wandb package "
                            "is not installed: pip install wandb, or leave the W&B project unset") from None
        # One W&B run per run directory: a resumed run continues the same W&B run.
        id_path = self.out_dir / WANDB_ID_FILE
        if id_path.exists():
            run_id = id_path.read_text(encoding="utf-8").strip()
        else:
            run_id = wandb.util.generate_id()
            id_path.write_text(run_id + "\n", encoding="utf-8")
        return wandb.init(project=project, name=run_name, id=run_id, resume="allow", config=jsonable(config),
                          dir=str(self.out_dir))

    @contextmanager
    def _saving(self, what: Path) -> Iterator[None]:
        """A full disk (or quota) while writing `what` is one line saying how to go on, as for a checkpoint."""
        try:
            yield
        except Exception as exc:
            if not disk_full(exc):
                raise
            from rookworld.checkpoint import disk_full_error  # here: checkpoint imports torch

            raise disk_full_error(what, self.out_dir) from exc

    def _append(self, name: str, record: Mapping[str, Any]) -> None:
        handle = self._files[name]
        with self._saving(self.out_dir / name):
            handle.write(json.dumps(jsonable(record), default=str) + "\n")
            handle.flush()

    def _scalars(self, step: int, values: Mapping[str, int | float]) -> None:
        with self._saving(self.out_dir / TENSORBOARD_DIR):  # TensorBoard's writer thread raises on a later call
            if self._tensorboard is not None:
                for key, value in values.items():
                    self._tensorboard.add_scalar(key, value, global_step=step)
            if self._wandb is not None:
                self._wandb.log(dict(values), step=step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One training step's metrics (slash names: "reward/mean", "kl/mean", "time/step", ...)."""
        values = metric_values(metrics)
        if not self.enabled:
            return
        self._append(METRICS_FILE, {"step": step, **values})
        self._scalars(step, values)

    def log_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Periodic eval metrics ("eval/A/exact", "eval/reward/mean", ...) at training step `step`."""
        values = metric_values(metrics)
        if not self.enabled:
            return
        self._append(EVAL_FILE, {"step": step, **values})
        self._scalars(step, values)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """A few sampled completions (any JSON-able fields: prompt, completion, reward, ...)."""
        if any("step" in row for row in rows):
            raise ValueError("a sample row must not carry 'step': pass it as the step argument")
        if not self.enabled:
            return
        for row in rows:
            self._append(SAMPLES_FILE, {"step": step, **row})

    def close(self) -> None:
        with self._saving(self.out_dir), ExitStack() as closing:  # each one is closed, even after another failed
            for handle in self._files.values():
                closing.callback(handle.close)
            self._files.clear()
            if self._tensorboard is not None:
                closing.callback(self._tensorboard.close)
                self._tensorboard = None
            if self._wandb is not None:
                closing.callback(self._wandb.finish)
                self._wandb = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        try:
            self.close()
        except UserError:
            if exc_type is None:  # else the error in flight comes first (a full disk fails close() again)
                raise


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


# The periodic eval's headline metrics, printed at each eval and, at the end of a run, as their change: key -> label
EVAL_HEADLINE: Mapping[str, str] = {"eval/P/acpl": "P/acpl", "eval/P/best_move_acc": "best-move",
                                    "eval/A/exact": "A/exact", "eval/selfplay/legal_half_moves": "self-play"}


def _with_se(value: float, se: float | None) -> str:
    return f"{value:.4g}" if se is None else f"{value:.4g} ± {se:.2g}"


def eval_line(step: int, metrics: Mapping[str, Any]) -> str:
    """One eval's headline metrics, each ± its SE: "eval step 50 | P/acpl 3.41 ± 0.15 | best-move 0.09 ± 0.012"."""
    parts = [f"{label} {_with_se(metrics[key], metrics.get(f'{key}/se'))}"
             for key, label in EVAL_HEADLINE.items() if isinstance(metrics.get(key), numbers.Real)]
    return " | ".join([f"eval step {step}", *parts])


def eval_change(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The headline metrics' change from a run's first eval to its last (None: fewer than two), ± the paired SE
    the last eval logged (KEY/delta/se, its change since step 0 on the same prompts) when it logged one for
    every metric shown, else the SE of the difference of two independent estimates (larger: a run resumed with
    other eval settings has no step-0 values to pair with)."""
    if len(records) < 2:
        return None
    first, last = records[0], records[-1]
    keys = [key for key in EVAL_HEADLINE if all(isinstance(r.get(key), numbers.Real) for r in (first, last))]
    paired = first["step"] == 0 and all(isinstance(last.get(f"{key}/delta/se"), numbers.Real) for key in keys)
    parts = []
    for key in keys:
        ses = [last[f"{key}/delta/se"]] if paired else [r.get(f"{key}/se") for r in (first, last)]
        spread = "" if None in ses else f" ± {math.hypot(*ses):.2g}"
        change = last[key] - first[key]
        parts.append(f"{EVAL_HEADLINE[key]} {first[key]:.4g} → {last[key]:.4g} (Δ {change:+.3g}{spread})")
    kind = "paired" if paired else "unpaired"
    return f"held-out change, step {first['step']} → {last['step']} ({kind} SE): " + " | ".join(parts)


class Progress:
    """Progress of a run on stdout: step/total, a few key metrics, seconds per step and ETA.

    On a terminal, a live rich bar. Otherwise (`make train | tee log`, a batch job) one plain line per
    `every` steps, plus the first and the last step, so a log shows the run is alive. Only rank 0 prints.
    fields maps metric keys to the short labels shown; stream defaults to sys.stdout.
    """

    DEFAULT_FIELDS: Mapping[str, str] = {"reward/mean": "reward", "kl/mean": "kl"}
    EVERY = 10

    def __init__(self, total: int, *, start: int = 0, description: str = "train",
                 fields: Mapping[str, str] | None = None, rank: int = 0, every: int = EVERY,
                 stream: IO[str] | None = None) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1 step, got {every}")
        self.total = total
        self.start = start
        self.description = description
        self.every = every
        self.fields = dict(self.DEFAULT_FIELDS if fields is None else fields)
        self.enabled = rank == 0
        self._stream = sys.stdout if stream is None else stream
        self._started_at = time.perf_counter()
        self._bar = None
        if not self.enabled or not self._stream.isatty():
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), console=Console(file=self._stream),
                                 transient=False)
        self._task = self._bar.add_task(description, total=total, completed=start, stats="")
        self._bar.start()

    def stats_text(self, step: int, metrics: Mapping[str, Any]) -> str:
        """The text shown after the bar, e.g. "reward 0.512 | kl 0.0031 | 2.41 s/step | ETA 0:13:20"."""
        parts = []
        for key, label in self.fields.items():
            value = metrics.get(key)
            if isinstance(value, numbers.Real):
                parts.append(f"{label} {float(value):.4g}")
        done = step - self.start
        if done > 0:
            per_step = (time.perf_counter() - self._started_at) / done
            parts.append(f"{per_step:.3g} s/step")
            parts.append(f"ETA {_clock(per_step * max(self.total - step, 0))}")
        return " | ".join(parts)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Show that `step` steps are complete, with these metrics."""
        if not self.enabled:
            return
        stats = self.stats_text(step, metrics or {})
        if self._bar is not None:
            self._bar.update(self._task, completed=step, stats=stats)
        elif step == self.start + 1 or step % self.every == 0 or step >= self.total:
            print(f"{self.description} step {step}/{self.total} | {stats}", file=self._stream, flush=True)

    def note(self, text: str) -> None:
        """A line of its own (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
