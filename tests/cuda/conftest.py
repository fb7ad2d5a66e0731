"""The devices the GPU check's tests run on, and a world of one process for DDP and FSDP2.

``device``: every device-agnostic test runs on ``cpu`` and on ``cuda``; ``cuda_device``: the
CUDA-only ones. A CUDA case skips where torch sees no GPU (and fails under ``AIKIT_REQUIRE_CUDA=1``,
which scripts/gpu_check.sh sets on the GPU machine). Self-contained: gpu_check.sh loads no other
conftest (see gpu_case.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gpu_case import require_cuda


@pytest.fixture(params=["cpu", "cuda"])
def device(request) -> torch.device:
    if request.param == "cuda":
        require_cuda()
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@pytest.fixture(params=["cuda"])
def cuda_device(request) -> torch.device:
    require_cuda()
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    """A plain process: a launcher's variables around the check would make aikit plan a world."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def world_of_one(device, tmp_path):
    """A torch.distributed process group of one process, in this process: NCCL on CUDA, gloo on
    the CPU (one GPU: NCCL across GPUs cannot be tried, its world of one can). Destroyed after."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            **options)
    try:
        yield backend
    finally:
        dist.destroy_process_group()
