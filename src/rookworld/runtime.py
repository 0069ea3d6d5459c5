"""Where a command runs: the torch device, the CPU thread count, the torchrun process group."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from rookworld.errors import UserError


def default_cpu_threads() -> int:
    """The usable cores shared among this machine's torchrun processes.

    On an idle machine both phases of a GRPO step gain from every core. Beside other busy processes, intra-op
    threads spin against them: pass threads=1 when running jobs side by side.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def pick_device(requested: str | None = None, threads: int | None = None) -> str:
    """`requested`, else cuda when available, else cpu; on cpu, torch uses `threads` threads (default: the cores)."""
    if threads is not None and threads < 1:
        raise UserError(f"--threads {threads}: must be >= 1 (leave it out to use every core)")
    device = usable_device(requested) if requested else "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type == "cpu":  # cpu:0 too
        torch.set_num_threads(threads or default_cpu_threads())
    return device


def usable_device(name: str) -> str:
    """`name` if it is a torch device that exists here; else one line naming --device (torch's own errors are a
    traceback: an assertion where torch has no CUDA)."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {name}: not a torch device; pass cpu, cuda or cuda:N, or leave it out") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"--device {name}: no CUDA device here; leave --device out or pass cpu")
        if (device.index or 0) >= count:
            raise UserError(f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    elif device.type != "cpu":
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError):
            raise UserError(f"--device {name}: no such device here; leave --device out or pass cpu") from None
    return name


def rank_cuda_device(local_rank: int, available: int) -> str:
    """The GPU of a torchrun process: one per process of a node."""
    if local_rank >= available:
        raise UserError(f"process {local_rank} of this node has no GPU ({available} CUDA device(s)): start at most "
                        f"{available} processes per node (torchrun --nproc-per-node) or pass --device cpu")
    return f"cuda:{local_rank}"


def fast_path(requested: bool | None, device: str) -> bool:
    """Whether the CUDA fast path (bf16 CUDA-graph sampling, bf16 autocast update) runs: `requested`,
    else on exactly when the device is CUDA."""
    on_cuda = device.startswith("cuda")
    if requested and not on_cuda:
        raise UserError(f"--fast-decode true needs a CUDA device, not {device!r}; leave it unset or false")
    return on_cuda if requested is None else requested


@dataclass(frozen=True)
class Dist:
    """This process's place among torchrun's `world` processes; rank 0 logs and checkpoints."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def process_group_backend(device: str) -> str:
    """gloo on CPU. On CUDA, NCCL for the CUDA tensors (the gradients) and gloo for the CPU ones: all_sum's
    sums and the pickles of all_gather_objects (torch's NCCL backend serves CUDA tensors only)."""
    return "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"


def init_distributed(device: str) -> tuple[Dist, str]:
    """This process's place among torchrun's (it sets WORLD_SIZE, RANK, LOCAL_RANK) and its device: on CUDA, the
    GPU of its local rank, made current before the process group starts, so that NCCL runs on it."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist(), device
    import torch.distributed as dist

    if torch.device(device).type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        device = rank_cuda_device(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(process_group_backend(device))
    return Dist(rank=dist.get_rank(), world=dist.get_world_size()), device


def all_sum(values: list[float], d: Dist) -> list[float]:
    if d.world == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def all_gather_objects(value: Any, d: Dist) -> list[Any]:
    if d.world == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, value)
    return out


def gather_indexed(local: dict[int, Any], d: Dist) -> dict[int, Any]:
    """Every rank's {index: item} (e.g. the groups it holds of one step) merged into one dict on every rank."""
    merged: dict[int, Any] = {}
    for part in all_gather_objects(local, d):
        merged.update(part)
    return merged


