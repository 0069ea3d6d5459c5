"""What `rookworld sft` and `rookworld train` share: the meaning of their common flags, AdamW, the
learning-rate schedule, and the rules of a run's config and of resuming it.

The two loops stay in sft.py and train.py; everything here is defined once so that a flag such as
`--eval-every 0` or `--resume DIR` means the same in both.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rookworld.errors import UserError
from rookworld.log import CONFIG_FILE  # the run directory's config.json, one table per config class

if TYPE_CHECKING:
    import torch

LR_SCHEDULES = ("constant", "linear", "cosine")

# Help of the flags both commands have; each config gives its own default.
SHARED_HELP = {
    "out": "run directory (metrics, checkpoints, config.json)",
    "steps": "optimizer steps of the run",
    "seed": "seed of every random stream of the run",
    "lr": "peak learning rate (AdamW)",
    "lr_schedule": f"learning rate after warm-up: {', '.join(LR_SCHEDULES)} decay to lr * min_lr_ratio at the end",
    "min_lr_ratio": "final learning rate of a decaying schedule, as a fraction of --lr",
    "warmup_steps": "linear learning-rate warm-up steps",
    "weight_decay": "AdamW weight decay of 2-D weights (matrices, embeddings); never of biases and norms",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "gradient norm clip (0: off)",
    "eval_every": "held-out evaluation every N steps and after the last step (0: off)",
    "checkpoint_every": "checkpoint every N steps; always after the last step (0: only then)",
    "keep_last": "checkpoint-step-N directories kept besides checkpoint-last (0: none)",
    "device": "torch device (default: cuda when available)",
    "threads": "CPU threads for torch (default: the cores, shared among torchrun ranks; 1 beside other busy jobs)",
    "tensorboard": "write TensorBoard scalars",
}


def shared(name: str, default: Any) -> Any:
    """A config field for a flag both commands have: its help comes from SHARED_HELP."""
    return field(default=default, metadata={"help": SHARED_HELP[name]})


def check_shared(cfg: Any) -> None:
    """ValueError naming the first shared field out of range."""
    checks = [
        (cfg.steps >= 1, f"steps must be >= 1, got {cfg.steps}"),
        (0 < cfg.lr < math.inf, f"lr must be finite and > 0, got {cfg.lr}"),
        (cfg.seed >= 0, f"seed must be >= 0, got {cfg.seed}"),
        (cfg.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}, got {cfg.lr_schedule!r}"),
        (0.0 <= cfg.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {cfg.min_lr_ratio}"),
        (cfg.weight_decay >= 0 and cfg.grad_clip >= 0, "weight_decay and grad_clip must be >= 0"),
        (0.0 <= cfg.beta1 < 1.0 and 0.0 <= cfg.beta2 < 1.0, f"beta1 and beta2 must be in [0, 1), got "
                                                           f"{cfg.beta1}, {cfg.beta2}"),
        (cfg.threads is None or cfg.threads >= 1, f"threads must be >= 1, got {cfg.threads}"),
    ]
    checks += [(getattr(cfg, name) >= 0, f"{name} must be >= 0, got {getattr(cfg, name)}")
               for name in ("warmup_steps", "eval_every", "checkpoint_every", "keep_last")]
    for ok, reason in checks:
        if not ok:
            raise ValueError(reason)


def _group_settings(cfg: Any) -> list[dict[str, Any]]:
    """The hyperparameters of make_optimizer's two groups: the 2-D weights' (decayed), then the others'."""
    betas = (cfg.beta1, cfg.beta2)
    return [{"weight_decay": cfg.weight_decay, "betas": betas}, {"weight_decay": 0.0, "betas": betas}]


def make_optimizer(model: torch.nn.Module, cfg: Any) -> torch.optim.AdamW:
    """AdamW with weight decay on 2-D weights only (decaying biases and norms only hurts)."""
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": params, **settings} for params, settings in
                              zip((decay, no_decay), _group_settings(cfg))], lr=cfg.lr)


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], cfg: Any) -> None:
    """A resumed run's AdamW: the saved moments with this config's betas and weight decay (torch's
    load_state_dict brings back the saved groups' own, which the flags given with --resume override; the
    learning rate is set before every step)."""
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, _group_settings(cfg), strict=True):
        group.update(settings)


def lr_factor(cfg: Any, step: int) -> float:
    """The learning rate of 0-based `step` as a fraction of cfg.lr: linear warm-up over warmup_steps,
    then constant, or a linear or cosine decay reaching min_lr_ratio at step cfg.steps, one past the last (as
    PyTorch's and Hugging Face's schedulers count)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    if cfg.lr_schedule == "linear":
        decay = 1.0 - progress
    elif cfg.lr_schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        return 1.0
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def checkpoint_due(cfg: Any, step: int) -> bool:
    """Whether the run checkpoints after `step` (1-based steps done)."""
    return step == cfg.steps or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)


def eval_due(cfg: Any, step: int) -> bool:
    """Whether the run evaluates after `step` (1-based steps done)."""
    return bool(cfg.eval_every) and (step == cfg.steps or step % cfg.eval_every == 0)


# ---------------------------------------------------------------- a run's config and resuming it

def add_run_arguments(parser: argparse.ArgumentParser, tables: str = "") -> None:
    """--config and --resume, with the same meaning in both commands."""
    parser.usage = "%(prog)s [--config TOML] [--resume DIR] [flags: see the sections below]"
    parser.add_argument("--config", help="TOML file: top-level keys set config fields by their names "
                        f"(lr_schedule for --lr-schedule){tables}; flags override it")
    parser.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its latest checkpoint, with "
                        "its saved config; flags given here override it (e.g. --steps)")


def run_configs(args: argparse.Namespace, classes: dict[str, type]) -> dict[str, Any]:
    """The run's configs by table name: defaults, then the TOML file (the first table's fields at its top
    level, the others in [name] tables) or the resumed run's config.json, then the flags given.

    --resume DIR writes to DIR (an --out elsewhere is an error) and cannot take --config, nor change the
    fields that made its model (KEPT_ON_RESUME). A changed --steps under a decaying schedule stretches the
    schedule: said on stderr, never silently.
    """
    from rookworld.config import build_config, load_toml

    first = next(iter(classes))
    if args.resume:
        if args.config:
            raise UserError("--resume continues a run with its own saved config; leave out --config")
        if getattr(args, "out", None) not in (None, args.resume):
            raise UserError(f"--resume {args.resume} writes to that run directory; leave out --out {args.out}")
        saved_path = Path(args.resume) / CONFIG_FILE
        if not saved_path.is_file():
            raise UserError(f"--resume {args.resume}: no {CONFIG_FILE} there; is it a run directory?")
        saved = json.loads(saved_path.read_text(encoding="utf-8"))
        if first not in saved:
            raise UserError(f"--resume {args.resume}: its {CONFIG_FILE} has no {first!r} table; it is not a "
                            f"run of this command")
        tables = {name: dict(saved.get(name, {})) for name in classes}
        _check_saved_fields(args.resume, tables, classes)
        tables[first]["out"] = args.resume
    else:
        values = load_toml(args.config) if args.config else {}
        tables = {name: values.pop(name, {}) for name in list(classes)[1:]}
        tables = {first: values, **tables}
        _check_tables(args.config, tables, classes)
    configs = {name: build_config(cls, args, tables[name]) for name, cls in classes.items()}
    if args.resume:
        for name, cls in classes.items():
            _check_kept(args.resume, build_config(cls, None, tables[name]), configs[name])
        _warn_stretched_schedule(args.resume, tables[first], configs[first])
    return configs


def _check_saved_fields(run: str, tables: dict[str, Any], classes: dict[str, type]) -> None:
    """A resumed run's saved config holds only fields this version has: a run saved by a version with options
    since removed cannot go on as it would have."""
    unknown = sorted(key for name, cls in classes.items()
                     for key in set(tables[name]) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise UserError(f"--resume {run}: its {CONFIG_FILE} sets {', '.join(unknown)}, which this version of "
                        f"rookworld does not have (the run was saved by another version); continue it with that "
                        f"version, or start a new run from its weights with --model {run}/checkpoint-last")


def _check_tables(path: str, tables: dict[str, Any], classes: dict[str, type]) -> None:
    """Each TOML table a mapping, and a key at the top level that belongs to a later table named with it."""
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise UserError(f"config file {path}: {name} = {table!r} must be a [{name}] table of its fields")
    fields = {name: {f.name for f in dataclasses.fields(cls)} for name, cls in classes.items()}
    first = next(iter(classes))
    for key in tables[first]:
        home = next((name for name, names in fields.items() if key in names and name != first), None)
        if key not in fields[first] and home is not None:
            raise UserError(f"config file {path}: {key} is a field of the [{home}] table; put it under [{home}]")


def _check_kept(run: str, saved: Any, cfg: Any) -> None:
    """A resumed run continues the model its checkpoint holds: a flag that would have made another model
    (the config's KEPT_ON_RESUME fields) cannot take effect, so it is an error rather than ignored."""
    for name in getattr(cfg, "KEPT_ON_RESUME", ()):
        if getattr(cfg, name) != getattr(saved, name):
            raise kept_error(run, name, getattr(cfg, name), getattr(saved, name))


def kept_error(run: str | Path, name: str, given: Any, saved: Any) -> UserError:
    """The refusal of a field that --resume `run` keeps as it saved it (`saved`), given here as `given`."""
    flag = "--" + name.replace("_", "-")
    return UserError(f"{flag} {given}: --resume {run} continues the model it saved (its {flag}: {saved}); leave "
                     f"out {flag}, or start a new run from {run}/checkpoint-last")


def _warn_stretched_schedule(run: str, saved: dict[str, Any], cfg: Any) -> None:
    """Said on stderr: a changed --steps stretches a decaying schedule (not when resume_checkpoint will refuse
    --steps the run has already taken)."""
    from rookworld import checkpoint

    before = saved.get("steps", cfg.steps)
    found = checkpoint.latest(run)
    taken = checkpoint.read_info(found)["step"] if found is not None else 0
    if before != cfg.steps and cfg.lr_schedule != "constant" and cfg.steps > taken:
        print(f"resuming with --steps {cfg.steps} (the run was set for {before}): its {cfg.lr_schedule} learning-"
              f"rate schedule is stretched to end at step {cfg.steps}, so the learning rate changes from the "
              f"next step on", file=sys.stderr)


def resume_checkpoint(out: str | Path, cfg: Any = None) -> Path:
    """The checkpoint a resumed run continues from; UserError when the directory holds none, or when it is
    already at the config's steps: the loop would not run, and the run's config would say steps it never took.
    A finished sft run may resume to write its --export (what a run stopped before its export needs)."""
    from rookworld import checkpoint

    found = checkpoint.latest(out)
    if found is None:
        raise UserError(f"--resume {out}: no complete checkpoint there (expected {out}/{checkpoint.LAST}), so "
                        f"no step to keep; start the run over with --out {out} (its flags: {out}/{CONFIG_FILE})")
    done = checkpoint.read_info(found)["step"]
    if cfg is not None and (cfg.steps < done or cfg.steps == done and not getattr(cfg, "export", None)):
        raise UserError(f"--steps {cfg.steps}: {out} is already at step {done}; give --steps > {done} to train on")
    return found


def check_new_out(out: str | Path) -> None:
    """A new run's --out, checked before any work: a directory or a path to make one at, no run that can be
    resumed, in a place that can be written (made later, by the run). A directory whose run left logs but no
    checkpoint is started over (RunLogger start_over): none of its steps can be kept."""
    from rookworld import checkpoint
    from rookworld.fsutil import output_dir

    out = Path(out)
    found = checkpoint.latest(out) if out.is_dir() else None
    if found is not None:
        raise UserError(f"--out {out}: holds a run that can be resumed ({found}); continue it with --resume {out}, "
                        f"or choose another output directory")
    output_dir(out, "--out")
