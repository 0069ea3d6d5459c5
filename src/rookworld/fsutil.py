"""Durable directory publishing: fsync a tree, then rename it into place without a moment of nothing.

Used by `hub.save_model` (model directories) and `checkpoint.save` (run checkpoints).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

OLD_SUFFIX = ".old"


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


def publish_dir(staged: Path, target: Path) -> None:
    """Rename the complete directory `staged` to `target`, replacing it; `target` or `target.old` is
    complete at every instant (readers fall back to `target.old` after a crash between the renames)."""
    old = old_path(target)
    if target.exists():
        if old.exists():  # left by a crash while deleting it after an earlier swap
            shutil.rmtree(old)
        os.rename(target, old)
    os.rename(staged, target)
    fsync_dir(target.parent)
    if old.exists():
        shutil.rmtree(old)
