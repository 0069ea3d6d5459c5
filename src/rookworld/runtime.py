"""Where a command runs: the torch device and the CPU thread count."""

from __future__ import annotations

import torch

# Decoding small models multiplies small matrices, where intra-op threads cost more than they save,
# and on a busy CPU they spin against other processes (measured: 13x slower generation with 2 threads
# beside two other busy processes on 2 cores).
DEFAULT_CPU_THREADS = 1


def pick_device(requested: str | None = None, threads: int | None = None) -> str:
    """`requested`, else cuda when available, else cpu; on cpu, torch uses `threads` threads (default 1)."""
    device = requested or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(threads or DEFAULT_CPU_THREADS)
    return device
