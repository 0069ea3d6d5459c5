"""`rookworld sweep --space SPACE.toml --trials N --out DIR [train flags]`: hyperparameter search on Optuna.

The space file names config fields of `rookworld train`, one table each: `low`/`high` (int or float by the
field's type; `log = true` for a log scale, or a `step`) or `choices = [...]`. Every other train flag given to
`sweep` (or set in `--config`) is the base of every trial. Each trial is a normal training run
`python -m rookworld.cli train BASE... TRIAL VALUES... --out DIR/trial-NNNN` in its own process (a crash
or a guard stops that trial only); while it runs, its eval.jsonl is read, each eval of the metric after step 0
is reported to Optuna, and the process is killed when the pruner says so. A trial's value is its metric at its
last eval: the score of the model the settings produce. The study lives in an Optuna storage (default: SQLite
in DIR), so the same command run again, or on another machine against a shared storage, adds trials to it.
Reference: docs/sweep.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import difflib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import typing
import warnings
from pathlib import Path
from typing import Any

from rookworld import grpo, train
from rookworld.config import load_toml
from rookworld.errors import UserError
from rookworld.flag_groups import TRAIN
from rookworld.log import EVAL_FILE, read_records
from rookworld.rewards import RewardConfig

CONFIG_CLASSES = (train.TrainConfig, grpo.GRPOConfig, RewardConfig)
NOT_SEARCHABLE = {"out": "each trial writes to DIR/trial-NNNN"}
TRIAL_DIR = re.compile(r"trial-(\d+)")  # DIR/trial-NNNN, NNNN the trial's number in its study
HARDWARE = frozenset(TRAIN["hardware"])  # may differ between the machines of one study
RANGE_KEYS = {"low", "high", "log", "step"}
TRIAL_LOG = "train.log"  # the trial's stdout and stderr, in its run directory
SUMMARY_FILE = "summary.json"
PLOT_FILE = "sweep.png"
DB_FILE = "study.db"
POLL_SECONDS = 0.5
ERROR_MARK = "rookworld train: error: "  # how the CLI reports a UserError (cli.py)
NEW_STUDY = "start a new study in another --out DIR (with a shared --storage, also under a new --study NAME)"
ABSENT = object()  # a key one of two compared configs does not have
# train.TrainingStopped says "N rollbacks (REASON); ...", REASON from train.runaway_reason
GUARDS = {"above kl_max": "guard: kl runaway", "reward collapse": "guard: reward drop"}


# ---------------------------------------------------------------- the space


def field_kinds() -> dict[str, type]:
    """Config field -> its scalar type (int, float, bool or str), for every field `rookworld train` takes."""
    kinds: dict[str, type] = {}
    for cls in CONFIG_CLASSES:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            found = {int, float, bool, str} & set(typing.get_args(hints[f.name]) or (hints[f.name],))
            if len(found) == 1 and typing.get_origin(hints[f.name]) not in (list, tuple):
                kinds[f.name] = found.pop()
    return kinds


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One searched field: a range (int or float) or a list of choices."""

    name: str
    kind: type
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple | None = None

    def suggest(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind is int:
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def describe(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        return {"low": self.low, "high": self.high, "log": self.log, "step": self.step}


def _typed(value: Any, kind: type, where: str) -> Any:
    """`value` as a value of a `kind` field (an int is a float too); UserError naming `where` otherwise."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else kind)
    if kind is bool:
        ok = isinstance(value, bool)
    if not ok:
        raise UserError(f"{where}: {value!r} is not a {kind.__name__} (the field's type)")
    return float(value) if kind is float else value


def _dimension(name: str, table: Any, kind: type, where: str) -> Dimension:
    if not isinstance(table, dict):
        raise UserError(f"{where} must be a table: `{name} = {{ low = ..., high = ... }}` (log = true for a log "
                        f"scale) or `{name} = {{ choices = [...] }}`, got {table!r}")
    unknown = sorted(set(table) - RANGE_KEYS - {"choices"})
    if unknown:
        raise UserError(f"{where}: unknown key(s) {unknown}; a range has low, high (log, step), a list has choices")
    if "choices" in table:
        choices = table["choices"]
        if set(table) != {"choices"}:
            raise UserError(f"{where}: give either choices or low/high, not both")
        if not isinstance(choices, list) or not choices:
            raise UserError(f"{where}: choices must be a non-empty list, got {choices!r}")
        return Dimension(name, kind, choices=tuple(_typed(c, kind, f"{where}.choices") for c in choices))
    if kind not in (int, float):
        raise UserError(f"{where}: {name} is a {kind.__name__} field: give choices = [...]")
    if "low" not in table or "high" not in table:
        raise UserError(f"{where}: a range needs both low and high (or give choices = [...])")
    low, high = (_typed(table[k], kind, f"{where}.{k}") for k in ("low", "high"))
    log = table.get("log", False)
    step = None if table.get("step") is None else _typed(table["step"], kind, f"{where}.step")
    checks = [(isinstance(log, bool), f"log must be true or false, got {log!r}"),
              (low < high, f"low {low} must be below high {high}"),
              (not log or low > 0, f"a log scale needs low > 0, got {low}"),
              (not (log and step), "log and step cannot be combined (Optuna)"),
              (step is None or step > 0, f"step must be > 0, got {step}")]
    for ok, reason in checks:
        if not ok:
            raise UserError(f"{where}: {reason}")
    return Dimension(name, kind, low, high, log, step)


def parse_space(path: str | Path) -> dict[str, Dimension]:
    """The search space of a TOML file: one table per `rookworld train` config field (module docstring)."""
    values = load_toml(path)
    if not values:
        raise UserError(f"space file {path} names no field: add a table such as `lr = {{ low = 1e-5, high = "
                        f"1e-4, log = true }}`")
    kinds = field_kinds()
    space = {}
    for name, table in values.items():
        if name in NOT_SEARCHABLE:
            raise UserError(f"space file {path}: {name} cannot be searched ({NOT_SEARCHABLE[name]})")
        if name not in kinds:
            close = difflib.get_close_matches(name, kinds, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (see rookworld train --help)"
            raise UserError(f"space file {path}: unknown field {name!r}: not a config field of rookworld train (its "
                            f"flags' names with _ for -, e.g. lr_schedule){hint}")
        space[name] = _dimension(name, table, kinds[name], f"space file {path}: {name}")
    return space


# ---------------------------------------------------------------- trials


def flag_args(values: dict[str, Any]) -> list[str]:
    """`--field-name value` for each value, as `rookworld train` parses them back (lists: the flag repeated)."""
    out = []
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            text = ("true" if item else "false") if isinstance(item, bool) else str(item)
            out += ["--" + name.replace("_", "-"), text]
    return out


def trial_configs(args: argparse.Namespace, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The configs `rookworld train` builds from the base flags (and --config) plus `params`, by table;
    UserError when they are invalid."""
    cfg, gcfg, rcfg = train.configs_from_args(argparse.Namespace(**{**vars(args), **params}))
    return {"train": dataclasses.asdict(cfg), "grpo": dataclasses.asdict(gcfg), "reward": dataclasses.asdict(rcfg)}


def no_eval(metric: str) -> str:
    return f"eval_every 0 turns off the periodic eval that {metric} comes from: give --eval-every N (N > 0)"


class TrialFailed(Exception):
    """A trial that produced no value; the message is its reason (counted in summary.json)."""


class TrialPruned(Exception):
    """The pruner stopped the trial."""


def failure_reason(log_text: str, returncode: int) -> str:
    """Why a train process failed, from its exit status and output: 'guard: kl runaway', 'guard: reward drop',
    'error: MESSAGE' (a UserError), 'crash: LAST LINE' (anything else)."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    error = next((line.split(ERROR_MARK, 1)[1] for line in reversed(lines) if ERROR_MARK in line), None)
    if error is not None:
        guard = next((reason for mark, reason in GUARDS.items() if "rollbacks (" in error and mark in error), None)
        return guard or f"error: {error[:300]}"
    if returncode < 0:
        return f"crash: killed by {signal.Signals(-returncode).name}"
    return f"crash: {lines[-1][:300]}" if lines else f"crash: exit status {returncode}"


def _stop(proc: subprocess.Popen) -> None:
    """End a trial's process group (train and its Stockfish processes): SIGTERM, then SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(10)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


@dataclasses.dataclass
class Sweep:
    """What every trial of one `rookworld sweep` command shares."""

    args: argparse.Namespace
    space: dict[str, Dimension]
    out: Path
    base: list[str]              # train flags of every trial (the base flags, --config)
    hardware: dict[str, Any]     # threads / processes of each trial when the base does not set them
    gpus: list[str]              # CUDA_VISIBLE_DEVICES of each job slot, round-robin (empty: leave it)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    errors: list[BaseException] = dataclasses.field(default_factory=list)

    def command(self, params: dict[str, Any], run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "rookworld.cli", "train", *self.base, *flag_args(params),
                *flag_args(self.hardware), "--out", str(run_dir)]

    def run_trial(self, study, slot: int) -> None:
        """Ask Optuna for one trial, train it, tell Optuna how it ended; update summary.json."""
        import optuna

        trial = study.ask()
        params = {name: dim.suggest(trial) for name, dim in self.space.items()}
        run_dir = self.out / f"trial-{trial.number:04d}"
        trial.set_user_attr("dir", str(run_dir))
        started = time.monotonic()
        try:
            value = self.train(trial, params, run_dir, slot)
        except TrialPruned as exc:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            ending = f"pruned {exc}"
        except (TrialFailed, KeyboardInterrupt) as exc:
            reason = str(exc) if isinstance(exc, TrialFailed) else "interrupted"
            trial.set_user_attr("failure", reason)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            ending = f"failed: {reason}"
        else:
            study.tell(trial, value)
            ending = f"complete: {self.args.metric} {value:.4g}"
        shown = " ".join(f"{k}={_fmt(v)}" for k, v in params.items())
        with self.lock:
            print(f"trial {trial.number} {ending} ({shown}) in {time.monotonic() - started:.0f} s", flush=True)
            write_summary(study, self.out, self.args.metric)

    def train(self, trial, params: dict[str, Any], run_dir: Path, slot: int) -> float:
        """Run the trial's train process, reporting its evals; its value, or TrialPruned / TrialFailed."""
        try:
            if trial_configs(self.args, params)["train"]["eval_every"] == 0:
                raise UserError(no_eval(self.args.metric))
        except UserError as exc:
            raise TrialFailed(str(exc)) from None
        env = dict(os.environ)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot % len(self.gpus)]
        run_dir.mkdir(parents=True, exist_ok=True)
        command = self.command(params, run_dir)
        log_path = run_dir / TRIAL_LOG
        if log_path.exists():  # never over the log of another study's trial ("x": not even in a race)
            raise TrialFailed(f"{log_path} exists: {run_dir} is another study's trial; {NEW_STUDY}")
        with open(log_path, "x", encoding="utf-8") as log:
            log.write(shlex.join(command) + "\n")
            log.flush()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)  # its own group: a kill reaches Stockfish too
            try:
                last = self.watch(trial, proc, run_dir / EVAL_FILE)
            finally:
                _stop(proc)
        if proc.returncode != 0:
            raise TrialFailed(failure_reason(log_path.read_text(encoding="utf-8", errors="replace"), proc.returncode))
        if last is None:
            raise TrialFailed(f"{self.args.metric} was never logged in {run_dir / EVAL_FILE}; see --metric")
        return last

    def watch(self, trial, proc: subprocess.Popen, eval_path: Path) -> float | None:
        """Report each new eval of the metric (after step 0) until the process ends; the last value."""
        metric, reported, last = self.args.metric, set(), None
        while True:
            done = proc.poll() is not None  # read after it ended: the last rows are on disk by then
            rows = read_records(eval_path) if eval_path.exists() else []
            for row in rows:
                step = int(row.get("step", 0))
                if step in reported or metric not in row:
                    continue
                reported.add(step)
                if row[metric] is None:
                    raise TrialFailed(f"non-finite {metric} at step {step}")
                last = float(row[metric])
                if step == 0:  # the starting model: the same in every trial
                    continue
                trial.report(last, step)
                if trial.should_prune():
                    raise TrialPruned(f"at step {step}: {metric} {last:.4g}")
            if done:
                if rows and last is None:
                    keys = difflib.get_close_matches(metric, rows[-1], n=3) or sorted(rows[-1])[:5]
                    raise TrialFailed(f"{metric} is not an eval metric (eval.jsonl has {', '.join(keys)}, ...)")
                return last
            if self.stop.wait(POLL_SECONDS):
                raise KeyboardInterrupt

    def worker(self, study, slot: int, tickets: collections.deque, finished: threading.Event) -> None:
        """Run trials while tickets last; `finished` is set at the end (Thread.join is not safe to interrupt)."""
        try:
            while not self.stop.is_set():
                with self.lock:
                    if not tickets:
                        return
                    tickets.pop()
                self.run_trial(study, slot)
        except Exception as exc:  # a storage or sweep fault: stop the sweep and report it
            self.errors.append(exc)
            self.stop.set()
        finally:
            finished.set()


def _wait(events: list[threading.Event]) -> None:
    """Until every event is set. A signal interrupts it cleanly, unlike Thread.join, which an interrupt can leave
    believing a running thread has ended."""
    while not all(event.is_set() for event in events):
        time.sleep(0.2)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------- the study


def open_storage(url: str | None, out: Path):
    """The default SQLite file in DIR, a journal file (a path ending in .journal or .log), or any Optuna RDB URL."""
    import optuna
    import sqlalchemy.exc

    if url is None:
        url = f"sqlite:///{(out / DB_FILE).resolve()}"
    if "://" not in url:
        if not url.endswith((".journal", ".log")):
            raise UserError(f"--storage {url}: give an Optuna RDB URL (sqlite:///FILE.db, postgresql://USER@HOST/DB) "
                            "or a journal file path ending in .journal or .log")
        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    try:
        return optuna.storages.RDBStorage(url)
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as exc:
        raise UserError(f"--storage {url}: cannot open it: {exc}") from None


def identity(args: argparse.Namespace, space: dict[str, Dimension]) -> dict[str, Any]:
    """What every command adding trials to one study must agree on: the metric, the space, and the base config
    (hardware fields, out and the searched fields left out)."""
    left_out = HARDWARE | {"out"} | set(space)
    base = {table: {k: v for k, v in values.items() if k not in left_out}
            for table, values in trial_configs(args, {}).items()}
    return json.loads(json.dumps({"metric": args.metric, "space": {n: d.describe() for n, d in space.items()},
                                  "base": base}))


def open_study(args: argparse.Namespace, space: dict[str, Dimension], out: Path):
    """The study the command adds trials to, checked against the command and against --out (check_owner); a
    study this command created and then refused is deleted again, so no empty study is left in the storage."""
    import optuna

    pruner = (optuna.pruners.MedianPruner(n_startup_trials=args.pruner_startup_trials,
                                          n_warmup_steps=args.pruner_warmup_steps)
              if args.pruner == "median" else optuna.pruners.NopPruner())
    storage = open_storage(args.storage, out)
    created = args.study not in optuna.get_all_study_names(storage)
    study = optuna.create_study(storage=storage, study_name=args.study, direction=args.direction,
                                load_if_exists=True, pruner=pruner)
    try:
        _check_study(study, args, space, out)
    except UserError:
        if created:
            optuna.delete_study(study_name=args.study, storage=storage)
        raise
    # The seed goes on with the study's trials: the same command run again draws new points (TPE's first 10
    # are random), while a new study with the same seed draws the same ones.
    seed = None if args.sampler_seed is None else args.sampler_seed + len(study.trials)
    with warnings.catch_warnings():  # constant_liar is marked experimental; it is what parallel machines need
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    return study


def _check_study(study, args: argparse.Namespace, space: dict[str, Dimension], out: Path) -> None:
    """UserError unless the study was started with this command's direction, metric, space and base config,
    and --out holds no other study's sweep; a new study takes this command's identity."""
    if study.direction.name.lower() != args.direction:
        raise UserError(f"study {args.study!r} was started with --direction {study.direction.name.lower()}; "
                        f"use that, or {NEW_STUDY}")
    mine, saved = identity(args, space), study.user_attrs.get("sweep")
    if saved is not None and saved != mine:
        differ = [k for k in dict.fromkeys([*mine, *saved]) if mine.get(k) != saved.get(k)]
        raise UserError(f"study {args.study!r} was started with another {' and '.join(differ)} "
                        f"({'; '.join(differences(saved, mine))}); run the same command, or {NEW_STUDY}")
    check_owner(study, out)
    if saved is None:
        study.set_user_attr("sweep", mine)


def differences(saved: Any, given: Any, where: str = "") -> list[str]:
    """`PATH: saved A, given B` for each leaf of two JSON values that differs (PATH: the keys, dotted)."""
    if isinstance(saved, dict) and isinstance(given, dict):
        return [line for key in dict.fromkeys([*saved, *given])
                for line in differences(saved.get(key, ABSENT), given.get(key, ABSENT),
                                        f"{where}.{key}" if where else key)]
    shown = ["nothing" if value is ABSENT else json.dumps(value) for value in (saved, given)]
    return [] if saved == given else [f"{where}: saved {shown[0]}, given {shown[1]}"]


def check_owner(study, out: Path) -> None:
    """Refuse a DIR that holds another study's sweep, whose files this study's would replace (trial numbers
    start at 0 in every study): a summary.json of another study, or of more trials than this study has, or a
    trial directory numbered past its trials (Optuna numbers a trial before its directory is made)."""
    count = len(study.trials)
    path = out / SUMMARY_FILE
    found = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    strays = sorted(entry.name for entry in out.iterdir()
                    if (number := TRIAL_DIR.fullmatch(entry.name)) and int(number.group(1)) >= count)
    if found is not None and (found["study"] != study.study_name or found["trials"] > count):
        what = f"{path} of study {found['study']!r} with {found['trials']} trials"
    elif strays:
        what = ", ".join(strays[:3]) + (", ..." if len(strays) > 3 else "")
    else:
        return
    raise UserError(f"--out {out} holds the sweep of another study ({what}; study {study.study_name!r} in this "
                    f"storage has {count} trials): {NEW_STUDY}")


def summary(study, metric: str) -> dict[str, Any]:
    """The study's counts, failure reasons and best trial (summary.json)."""
    import optuna

    state = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    counts = collections.Counter(t.state for t in trials)
    complete = [t for t in trials if t.state == state.COMPLETE]
    best = (max if study.direction.name == "MAXIMIZE" else min)(complete, key=lambda t: t.value) if complete else None
    return {
        "study": study.study_name, "metric": metric, "direction": study.direction.name.lower(),
        "trials": len(trials), "complete": counts[state.COMPLETE], "pruned": counts[state.PRUNED],
        "failed": counts[state.FAIL], "running": counts[state.RUNNING],
        "failures": dict(collections.Counter(t.user_attrs.get("failure", "unknown") for t in trials
                                             if t.state == state.FAIL).most_common()),
        "best_value": best.value if best else None, "best_params": best.params if best else None,
        "best_trial": best.number if best else None, "best_trial_dir": best.user_attrs.get("dir") if best else None,
    }


def write_summary(study, out: Path, metric: str) -> dict[str, Any]:
    found = summary(study, metric)
    tmp = out / (SUMMARY_FILE + ".tmp")
    tmp.write_text(json.dumps(found, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / SUMMARY_FILE)
    return found


def table(study, metric: str) -> str:
    """One line per trial: number, state, value, minutes, parameters or failure reason; * marks the best."""
    best = summary(study, metric)["best_trial"]
    lines = [f"  trial  state     {metric:>18}  minutes  parameters / reason"]
    for t in study.get_trials(deepcopy=False):
        value = "" if t.value is None else f"{t.value:.4g}"
        minutes = "" if t.duration is None else f"{t.duration.total_seconds() / 60:.1f}"
        detail = t.user_attrs.get("failure") or " ".join(f"{k}={_fmt(v)}" for k, v in t.params.items())
        lines.append(f"{'*' if t.number == best else ' '} {t.number:5d}  {t.state.name:<8}  {value:>18}  "
                     f"{minutes:>7}  {detail}")
    return "\n".join(lines)


def write_plot(study, path: Path) -> Path | None:
    """Optuna's matplotlib optimisation history, parameter importances and parallel coordinates, stacked in
    one PNG; a panel Optuna cannot draw yet (importances need 2 complete trials and 2 parameters) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import optuna
    from optuna.visualization import matplotlib as panels

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        return None
    makers = [panels.plot_optimization_history, panels.plot_parallel_coordinate]
    if len(complete) >= 2 and len(complete[0].params) >= 2:
        makers.insert(1, panels.plot_param_importances)
    images = []
    with warnings.catch_warnings(), plt.rc_context({"figure.figsize": (10, 4.5), "figure.dpi": 100}):
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        for make in makers:
            ax = make(study)
            figure = (ax.flat[0] if isinstance(ax, np.ndarray) else ax).figure
            figure.tight_layout()
            figure.canvas.draw()
            images.append(np.asarray(figure.canvas.buffer_rgba()))
            plt.close(figure)
    width = max(image.shape[1] for image in images)
    padded = [np.pad(image, ((0, 0), (0, width - image.shape[1]), (0, 0)), constant_values=255) for image in images]
    plt.imsave(path, np.concatenate(padded))
    return path


# ---------------------------------------------------------------- command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sweep", "--out DIR is the sweep's directory (trials in DIR/trial-NNNN); "
                                      "the train flags below are the base of every trial, as in rookworld train")
    group.add_argument("--space", required=True, metavar="SPACE.toml",
                       help="search space: one table per train config field, {low, high[, log][, step]} or "
                            "{choices = [...]} (example: rookworld/assets/sweeps/grpo.toml)")
    group.add_argument("--trials", type=int, required=True, metavar="N", help="trials this command adds")
    group.add_argument("--storage", metavar="URL", help="Optuna storage: an RDB URL (sqlite:///FILE.db, "
                       "postgresql://...) or a journal file (a path ending in .journal or .log) (default: "
                       f"sqlite in DIR/{DB_FILE})")
    group.add_argument("--study", default="sweep", metavar="NAME",
                       help="study name in the storage (default: sweep); each study has its own --out DIR")
    group.add_argument("--jobs", type=int, default=1, metavar="K", help="trials at once on this machine; they "
                       "split its cores (--threads, --processes) or its GPUs, round-robin (default: 1)")
    group.add_argument("--metric", default="eval/reward/mean", help="eval metric a trial reports; its value is "
                       "the metric at its last eval (default: eval/reward/mean)")
    group.add_argument("--direction", choices=("maximize", "minimize"), default="maximize",
                       help="maximize or minimize the metric (default: maximize; minimize for eval/P/acpl)")
    group.add_argument("--pruner", choices=("median", "none"), default="median",
                       help="stop a trial whose best metric so far is worse than the median of the complete "
                            "trials at the same step (Optuna's MedianPruner), or never (default: median)")
    group.add_argument("--pruner-startup-trials", type=int, default=5, metavar="N",
                       help="no pruning before N trials are complete (default: 5)")
    group.add_argument("--pruner-warmup-steps", type=int, default=0, metavar="N",
                       help="no pruning at evals before training step N (default: 0)")
    group.add_argument("--sampler-seed", type=int, default=None, metavar="S", help="seed of the TPE sampler, "
                       "plus the study's trial count, so that a resumed study draws new points (default: none; give "
                       "each machine of one study a different seed or none)")
    train.add_arguments(parser)
    parser.usage = "%(prog)s --space SPACE.toml --trials N --out DIR [sweep flags] [train flags]"


def _check(args: argparse.Namespace, space: dict[str, Dimension]) -> None:
    checks = [(not args.resume, "--resume is a train flag: a sweep resumes when the same command runs again"),
              (args.out is not None, "--out DIR is required: the sweep's directory (trials in DIR/trial-NNNN)"),
              (args.trials >= 1 and args.jobs >= 1, "--trials and --jobs must be >= 1"),
              (args.pruner_startup_trials >= 0 and args.pruner_warmup_steps >= 0,
               "--pruner-startup-trials and --pruner-warmup-steps must be >= 0"),
              (args.metric.startswith("eval/"), f"--metric {args.metric}: a sweep reads eval.jsonl, whose metrics "
                                                "start with eval/ (eval/reward/mean, eval/P/acpl, ...)")]
    for ok, reason in checks:
        if not ok:
            raise UserError(reason)
    if "eval_every" not in space and trial_configs(args, {})["train"]["eval_every"] == 0:
        raise UserError(no_eval(args.metric))
    given = [name for name in space if getattr(args, name, None) is not None]
    if given:
        raise UserError(f"{', '.join('--' + n.replace('_', '-') for n in given)} given as a flag and searched in "
                        f"{args.space}: drop the flag or the table")


def _resources(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """Each trial's threads and Stockfish processes (the cores split among --jobs, where the base does not set
    them), and the GPUs the job slots take in turn (on CUDA with --device unset or cuda)."""
    import torch

    from rookworld.runtime import default_cpu_threads

    base = trial_configs(args, {})["train"]  # the flags and --config
    threads = base["threads"] or max(1, default_cpu_threads() // args.jobs)
    hardware = {name: threads for name in ("threads", "processes") if base[name] is None}
    gpus: list[str] = []
    if args.device in (None, "cuda") and torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    return hardware, gpus


def base_flags(args: argparse.Namespace) -> list[str]:
    """The train flags given to sweep (and --config), as each trial's command line repeats them."""
    names = [f.name for cls in CONFIG_CLASSES for f in dataclasses.fields(cls) if f.name != "out"]
    config = ["--config", str(Path(args.config).resolve())] if args.config else []
    return config + flag_args({n: getattr(args, n) for n in names if getattr(args, n, None) is not None})


def run(args: argparse.Namespace) -> int:
    import optuna

    space = parse_space(args.space)
    _check(args, space)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(args, space, out)
    hardware, gpus = _resources(args)
    sweep = Sweep(args, space, out, base_flags(args), hardware, gpus)
    before = len(study.trials)
    print(f"sweep: study {args.study!r} ({before} trials before), adding {args.trials}, {args.jobs} at a time"
          + (f", --threads {hardware['threads']} each" if "threads" in hardware else "")
          + (f", GPUs {','.join(gpus)} in turn" if gpus else ""), flush=True)
    tickets = collections.deque(range(args.trials))
    finished = [threading.Event() for _ in range(args.jobs)]
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill ends the trials' processes too
    try:
        for slot in range(args.jobs):
            threading.Thread(target=sweep.worker, args=(study, slot, tickets, finished[slot]), daemon=True).start()
        _wait(finished)
    except KeyboardInterrupt:
        sweep.stop.set()
        _wait(finished)  # each worker stops its trial's processes and records the trial
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        write_summary(study, out, args.metric)
    if sweep.errors:
        raise sweep.errors[0]
    print(table(study, args.metric))
    found = write_summary(study, out, args.metric)
    plot = write_plot(study, out / PLOT_FILE)
    best = (f"best {args.metric} {_fmt(found['best_value'])} in {found['best_trial_dir']}"
            if found["best_trial"] is not None else "no complete trial")
    print(f"{found['trials']} trials: {found['complete']} complete, {found['pruned']} pruned, {found['failed']} "
          f"failed; {best}")
    print(f"summary: {out / SUMMARY_FILE}" + (f"; plots: {plot}" if plot else " (no complete trial: no plots)"))
    return 0
