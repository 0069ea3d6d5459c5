"""Atomic checkpoints and exact resume of a training run (used by `rookworld train` and `rookworld sft`).

Layout under a run directory OUT:

    checkpoint-last/            the latest complete checkpoint, always there once one was saved
    checkpoint-step-000200/     the last `keep_last` checkpoints by step
    checkpoint-best/            the best by an eval metric

Each checkpoint is a Hugging Face model directory (written by the caller's `write_model(dir)`) plus
`trainer_state.pt` (the caller's state dict: optimizer, scheduler, RNG streams, sampler position, ...)
and `trainer_state.json` (step, time and metrics, for people; and the size and CRC-32 of every other file).

A checkpoint is written into a temporary directory beside its final name, fsynced, then renamed into
place. A directory is replaced by renaming the old one to `NAME.old`, the new one to `NAME`, then
deleting `NAME.old`: at every instant `NAME` or `NAME.old` is complete, and `latest()` falls back to
`NAME.old` after a crash between the two renames. The step and best copies share the files of
`checkpoint-last` through hard links (a copy where the filesystem has none), so they cost no disk;
published files are never written again. One process (rank 0) saves into a run directory.

Faults: a process killed mid-save leaves the previous checkpoint as it was (the next save deletes the
temporary directory). A full disk (or quota) is a UserError naming the checkpoint, and the checkpoints saved
before stay intact. `latest()` checks each file against the sizes and CRC-32s that save() recorded and
skips a damaged checkpoint with a warning, for the previous complete one: a resumed run never starts
from damaged files, nor silently from scratch.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import random
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rookworld.errors import UserError
from rookworld.fsutil import OLD_SUFFIX, disk_full, fsync_tree, jsonable, old_path, publish_dir

LAST = "checkpoint-last"
BEST = "checkpoint-best"
STEP_PATTERN = re.compile(r"checkpoint-step-(\d+)")
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
_TMP_PREFIX = ".tmp-"
log = logging.getLogger(__name__)


def step_dir_name(step: int) -> str:
    return f"checkpoint-step-{step:06d}"


def is_complete(ckpt_dir: Path) -> bool:
    return (ckpt_dir / STATE_PT).is_file() and (ckpt_dir / STATE_JSON).is_file()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _staging_dir(out: Path, name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}-", dir=out))


def disk_full_error(target: Path, out: Path) -> UserError:
    """The one line for a full disk (or quota) met while saving `target` of the run in `out`: what is left, and
    how to go on: --resume when a checkpoint was saved before, else a start over (--resume refuses a run
    without one, training.resume_checkpoint)."""
    if latest(out) is None:
        then = f"No checkpoint was saved yet: free some space, then start the run over with --out {out}"
    else:
        then = f"The checkpoints saved before are intact: free some space, then continue the run with --resume {out}"
    return UserError(f"could not save {target}: {os.strerror(errno.ENOSPC)} (or quota exceeded). {then}")


def _publish(target: Path, fill: Callable[[Path], None]) -> None:
    """Create the checkpoint directory with fill(dir) beside `target`, then publish it as `target`."""
    try:
        staging = _staging_dir(target.parent, target.name)
        try:
            staged = staging / "checkpoint"
            fill(staged)
            fsync_tree(staged)
            publish_dir(staged, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except Exception as exc:
        if not disk_full(exc):
            raise
        raise disk_full_error(target, target.parent) from exc


def _publish_copy(source: Path, target: Path) -> None:
    """Publish a hard-linked copy of the complete checkpoint `source` as `target`."""
    _publish(target, lambda staged: shutil.copytree(source, staged, copy_function=_link_or_copy))


def _remove_strays(out: Path) -> None:
    """Delete temporary directories left by a crash in the middle of a save."""
    for path in out.glob(f"{_TMP_PREFIX}checkpoint-*"):
        shutil.rmtree(path, ignore_errors=True)


def clear_debris(out_dir: str | Path) -> None:
    """What a crash in a save leaves when no save follows (a run resumed after its final save was cut
    off): temporary directories, and `.old` copies beside a whole checkpoint-last or checkpoint-best.
    Call from one process, when no save is under way (on resume)."""
    out = Path(out_dir)
    _remove_strays(out)
    for name in (LAST, BEST):
        if (out / name).is_dir() and is_complete(out / name) and damage(out / name) is None:
            shutil.rmtree(old_path(out / name), ignore_errors=True)


def step_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, dir) of the complete checkpoint-step-N directories, oldest first."""
    found = []
    for path in Path(out_dir).glob("checkpoint-step-*"):
        match = STEP_PATTERN.fullmatch(path.name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def _prune(out: Path, step: int, keep_last: int) -> None:
    """Keep the newest `keep_last` step checkpoints up to `step`. Later ones belong to the abandoned
    branch of a run resumed from an earlier checkpoint; partial ones and .old leftovers are crash debris."""
    earlier = [path for saved_step, path in step_checkpoints(out) if saved_step <= step]
    kept = earlier[-keep_last:] if keep_last else []  # [-0:] would keep them all
    for path in out.glob("checkpoint-step-*"):
        if path not in kept and STEP_PATTERN.fullmatch(path.name.removesuffix(OLD_SUFFIX)):
            shutil.rmtree(path)


def _crc32(path: Path) -> str:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _manifest(ckpt_dir: Path) -> dict[str, dict[str, Any]]:
    """Size and CRC-32 of every file of a checkpoint but trainer_state.json, which records them."""
    return {path.relative_to(ckpt_dir).as_posix(): {"bytes": path.stat().st_size, "crc32": _crc32(path)}
            for path in sorted(ckpt_dir.rglob("*")) if path.is_file() and path.name != STATE_JSON}


def damage(ckpt_dir: Path) -> str | None:
    """What makes a complete checkpoint unusable (a file missing, truncated or changed since save(), an
    unreadable trainer_state.json); None when it is whole. Checkpoints saved without sizes and CRC-32s
    (before they were recorded) are taken as whole."""
    try:
        files = read_info(ckpt_dir).get("files", {})
        expected = {name: (int(entry["bytes"]), str(entry["crc32"])) for name, entry in files.items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        return f"{STATE_JSON} is unreadable ({exc})"
    for name, (size, crc) in expected.items():
        path = ckpt_dir / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were saved"
        if _crc32(path) != crc:
            return f"{name} differs from the saved file (CRC-32)"
    return None


def _complete_copy(target: Path) -> Path | None:
    """`target`, or `target.old` after a crash between the two renames of publish_dir; None if neither."""
    for candidate in (target, old_path(target)):
        if is_complete(candidate):
            return candidate
    return None


def _metric_of(ckpt_dir: Path | None, name: str) -> float | None:
    """The metric recorded with a checkpoint; None when absent or unreadable (any value then beats it)."""
    try:
        value = None if ckpt_dir is None else read_info(ckpt_dir).get("metrics", {}).get(name)
        return None if value is None else float(value)
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _improves(value: float, current: float | None, higher_is_better: bool) -> bool:
    if not math.isfinite(value):
        return False
    return current is None or (value > current if higher_is_better else value < current)


def save(out_dir: str | Path, step: int, state: Mapping[str, Any], write_model: Callable[[Path], None],
         metrics: Mapping[str, float] | None = None, keep_last: int = 3, best_metric: str | None = None,
         higher_is_better: bool = True) -> Path:
    """Save a checkpoint of `step`; returns OUT/checkpoint-last.

    state: plain data only (tensors, dicts, lists, tuples, numbers, strings, None), so that it loads with
        torch.load(weights_only=True); "step" is recorded by save() itself.
    write_model(dir): writes the model (and tokenizer) into `dir`, which it must create.
    metrics: written to trainer_state.json; `best_metric` is looked up there.
    keep_last: how many checkpoint-step-N directories to keep (0: none, only checkpoint-last). Those of
        steps after `step` (left by a run resumed from an earlier checkpoint) are deleted.
    best_metric: when given and present in `metrics`, checkpoint-best is replaced if this value beats
        its value (higher or lower is better by `higher_is_better`); non-finite values never do.
    """
    if "step" in state:
        raise ValueError("state must not contain 'step': save() records the step itself")
    if keep_last < 0:
        raise ValueError(f"keep_last must be >= 0, got {keep_last}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _remove_strays(out)
    last = out / LAST

    def fill(staged: Path) -> None:
        write_model(staged)
        if not staged.is_dir():
            raise RuntimeError(f"write_model did not create the model directory {staged}")
        state_path = staged / STATE_PT
        with state_path.open("wb") as f:  # a Python file keeps an OSError (ENOSPC) in the chain of torch's error
            torch.save({**state, "step": step}, f)
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(state_path))
        if unsafe:
            raise TypeError(f"checkpoint state holds types that torch.load(weights_only=True) refuses: {unsafe};"
                            " store them as tensors or plain Python values")
        info = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "metrics": jsonable(dict(metrics or {})), "files": _manifest(staged)}
        (staged / STATE_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    _publish(last, fill)
    if keep_last > 0:
        _publish_copy(last, out / step_dir_name(step))
    _prune(out, step, keep_last)
    if best_metric is not None and metrics is not None and best_metric in metrics:
        value = float(metrics[best_metric])
        if _improves(value, _metric_of(best(out), best_metric), higher_is_better):
            _publish_copy(last, out / BEST)
    return last


def latest(out_dir: str | Path) -> Path | None:
    """The newest whole checkpoint of a run: checkpoint-last, else checkpoint-last.old (a crash in the
    middle of replacing it), else the newest checkpoint-step-N; None when there is none. Damaged ones
    (see damage()) are skipped with a warning naming them; UserError when every one is damaged.
    Reads only: safe for every rank to call at once."""
    out = Path(out_dir)
    candidates = [path for path in (out / LAST, old_path(out / LAST)) if is_complete(path)]
    candidates += [path for _step, path in reversed(step_checkpoints(out))]
    skipped = []
    for candidate in candidates:
        problem = damage(candidate)
        if problem is None:
            if skipped:
                log.warning("%s: skipped the damaged %s; using %s", out, "; ".join(skipped), candidate.name)
            return candidate
        skipped.append(f"{candidate.name} ({problem})")
    if skipped:
        raise UserError(f"{out}: every checkpoint is damaged: {'; '.join(skipped)}")
    return None


def best(out_dir: str | Path) -> Path | None:
    """checkpoint-best (or its .old copy after a crash mid-replace), None when there is none."""
    return _complete_copy(Path(out_dir) / BEST)


def read_info(ckpt_dir: str | Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint: step, time, metrics, files (sizes and CRC-32s)."""
    return json.loads((Path(ckpt_dir) / STATE_JSON).read_text(encoding="utf-8"))


def load_state(ckpt_dir: str | Path) -> dict[str, Any]:
    """The state dict given to save(), plus "step"; tensors on the CPU (optimizer.load_state_dict moves
    its state to the parameters' device)."""
    path = Path(ckpt_dir) / STATE_PT
    if not path.is_file():
        raise UserError(f"{ckpt_dir} is not a training checkpoint: it has no {STATE_PT}; "
                        "pass a checkpoint-* directory of a run")
    return torch.load(path, map_location="cpu", weights_only=True)


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every random stream of this process as plain data: Python `random`, NumPy's global generator,
    torch CPU, torch CUDA (each visible device, when available), and the named explicit generators."""
    version, internal, gauss_next = random.getstate()
    _name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached_gaussian)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: generator.get_state() for name, generator in (generators or {}).items()},
    }


def restore_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Put every stream captured by capture_rng_state back. CUDA states are restored for the devices
    visible now (none on a CPU-only machine); a named generator missing from `state` is an error."""
    python = state["python"]
    random.setstate((python["version"], tuple(int(x) for x in python["internal"].tolist()), python["gauss_next"]))
    numpy_state = state["numpy"]
    np.random.set_state(("MT19937", numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
    saved = state["generators"]
    for name, generator in (generators or {}).items():
        if name not in saved:
            raise ValueError(f"the checkpoint has no state for generator {name!r}; it has {sorted(saved)}")
        generator.set_state(saved[name])
