"""The auto search on a GPU whose memory is capped (``torch.cuda.set_per_process_memory_fraction``):
CUDA's caching allocator raises ``torch.OutOfMemoryError``, the cache is emptied between tries, and
the plan found keeps the global batch (issue 38). Skips where there is no GPU."""

from __future__ import annotations

import torch

import aikit.elastic.Torch as elastic

MIB = 2**20


def test_the_auto_search_finds_the_largest_device_batch_under_a_memory_cap(cuda_device):
    total = torch.cuda.get_device_properties(cuda_device).total_memory
    cap = 512 * MIB  # what the allocator may hold, whatever the GPU
    net = torch.nn.Linear(4096, 4096, device=cuda_device)
    sample = 16 * MIB  # one sample's activations: a row of 4M floats

    def trial(batch: int) -> None:
        net.zero_grad(set_to_none=True)
        x = torch.randn(batch, sample // 4 // 4096, 4096, device=cuda_device)
        net(torch.tanh(x)).square().mean().backward()
        net.zero_grad(set_to_none=True)

    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated(cuda_device) + cap) / total, cuda_device)
    try:
        plan = elastic.init(256, "auto", trial=trial)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, cuda_device)
        torch.cuda.empty_cache()
    tries = {size: fitted for size, fitted, _ in elastic.search.tries}
    assert plan.global_batch_size == 256 and plan.steps * plan.device_batch >= 256
    assert any(not fitted for fitted in tries.values())  # CUDA's allocator truly refused
    assert tries[plan.device_batch] and not any(fits for size, fits in tries.items() if size > plan.device_batch)
    assert plan.device_batch * sample < cap  # what fits is under the cap


def test_a_search_where_the_largest_fits_tries_once_and_keeps_one_ga_step(device):
    tried = []
    plan = elastic.init(64, "auto", trial=lambda batch: tried.append(torch.ones(batch, 8, device=device).sum()))
    assert len(tried) == 1 and (plan.global_batch_size, plan.steps, plan.device_batch) == (64, 1, 64)
