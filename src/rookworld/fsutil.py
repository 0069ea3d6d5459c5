"""Durable directory publishing: fsync a tree, then rename it into place without a moment of nothing
(`hub.save_model`, `checkpoint.save`); output paths checked before a command's work (`output_file`,
`writable_dir`); a full disk told apart from other write errors (`disk_full`); values made fit for JSON files
(`jsonable`).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from rookworld.errors import UserError

OLD_SUFFIX = ".old"
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def output_file(path: Path, flag: str) -> Path:
    """`path` ready for a file that a command writes when its work is done: refused at once if it is a
    directory or its directory cannot be written (made when missing, as `plot` does), so that no result is
    lost at the end."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory: give the path of a file")
    writable_dir(path.parent, f"{flag} {path}")
    return path


def output_dir(directory: Path, flag: str) -> Path:
    """`directory` checked before a command's work writes there: a directory, or a path one can be made at (no
    file at it or above it), in a place it can write (the nearest existing directory takes a temporary file);
    nothing is made, so a command refused later leaves no trace. UserError naming `flag` otherwise."""
    existing = next(path for path in (directory, *directory.parents) if path.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {directory}: {existing} is a file, not a directory; choose another directory")
    writable_dir(existing, f"{flag} {directory}")
    return directory


def writable_dir(directory: Path, named: str) -> None:
    """Make `directory` (and its parents) and write a temporary file there, before a command's work: a place
    it cannot write is one UserError starting with `named` (the flag and its value), not a traceback at the
    first write after the work."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UserError(f"{named}: cannot write in {directory} ({exc.strerror}): give another path") from None


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` or an exception in its chain is a full disk or quota: an OSError with that errno, or
    a library error that quotes the OS message (safetensors' Rust writer keeps only the text)."""
    messages = [os.strerror(code) for code in FULL_DISK]
    seen: BaseException | None = exc
    while seen is not None:
        if (isinstance(seen, OSError) and seen.errno in FULL_DISK) or any(m in str(seen) for m in messages):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def old_path(target: Path) -> Path:
    """Where `publish_dir` keeps the previous `target` between its two renames."""
    return target.with_name(target.name + OLD_SUFFIX)


def fsync_dir(path: Path) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync on Windows; renames are durable there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under root to disk, so a rename publishes durable data."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def foreign_entries(target: Path, names: Collection[str]) -> list[Path]:
    """The entries of `target` and of `target.old` whose names are not in `names`: what `publish_dir` would
    delete beside a directory of those files (callers refuse such a target instead)."""
    return sorted(entry for directory in (target, old_path(target)) if directory.is_dir()
                  for entry in directory.iterdir() if entry.name not in names)


def publish_dir(staged: Path, target: Path) -> None:
    """Rename the complete directory `staged` to `target`, replacing it; `target` or `target.old` is
    complete at every instant (readers fall back to `target.old` after a crash between the renames).
    Both are deleted whole: check a target the user named with `foreign_entries` first."""
    old = old_path(target)
    if target.exists():
        if old.exists():  # left by a crash while deleting it after an earlier swap
            shutil.rmtree(old)
        os.rename(target, old)
    os.rename(staged, target)
    fsync_dir(target.parent)
    if old.exists():
        shutil.rmtree(old)


def jsonable(value: Any) -> Any:
    """`value` with non-finite floats replaced by None (recursively through dicts, lists, tuples)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
