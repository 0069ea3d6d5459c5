"""Where a command runs (runtime.py): the device and its threads, the torchrun process group and its collectives."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rookworld.runtime import Dist, all_gather_objects, all_sum, init_distributed, pick_device, process_group_backend


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_threads_are_set_for_every_name_of_the_cpu(threads, device):
    torch.set_num_threads(2)
    assert pick_device(device, 1) == device and torch.get_num_threads() == 1


def test_one_process_needs_no_process_group():
    assert init_distributed("cpu") == (Dist(), "cpu")
    assert not dist.is_initialized()


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("cpu:0", "gloo"), ("cuda", "cpu:gloo,cuda:nccl"),
                                             ("cuda:1", "cpu:gloo,cuda:nccl")])
def test_cuda_runs_take_gloo_for_their_cpu_tensors(device, backend):
    assert process_group_backend(device) == backend


def _collectives_worker(rank: int, port: int, backend: str, out: Path) -> None:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        d = Dist(rank=rank, world=2)
        result = {"sum": all_sum([rank + 1.0, 0.5], d), "gathered": all_gather_objects({"rank": rank}, d)}
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_the_cpu_collectives_of_a_cuda_process_group_run(tmp_path):
    # The backend map of a CUDA run, with gloo standing in for NCCL on the CUDA side (it is CPU-only here):
    # NCCL serves CUDA tensors only, so all_sum's CPU sums and the pickled objects must go through the cpu entry.
    # This does not run NCCL itself: that needs two GPUs (torchrun --nproc_per_node 2 ... --device cuda).
    backend = process_group_backend("cuda").replace("cuda:nccl", "cuda:gloo")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_collectives_worker, args=(port, backend, tmp_path), nprocs=2,
                                          start_method="spawn")
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result == {"sum": [3.0, 1.0], "gathered": [{"rank": 0}, {"rank": 1}]}
