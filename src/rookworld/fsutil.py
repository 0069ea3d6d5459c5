"""Durable directory publishing: fsync a tree, then rename it into place without a moment of nothing
(`hub.save_model`, `checkpoint.save`); output file paths checked before a command's work (`output_file`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection
from pathlib import Path

from rookworld.errors import UserError

OLD_SUFFIX = ".old"


def output_file(path: Path, flag: str) -> Path:
    """`path` ready for a file that a command writes when its work is done: refused at once if it is a
    directory, its parent directories made (as `plot` does), so that no result is lost at the end."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory: give the path of a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot create its directory ({exc.strerror}): give another path") from None
    return path


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
