"""Out of memory in torch: telling it from other errors, freeing what a failed step held, saying how much there is.

What each allocator raises (torch 2.13): CUDA's caching allocator ``torch.OutOfMemoryError`` (a
``RuntimeError``: "CUDA out of memory. Tried to allocate 2.00 GiB ..."); the CPU allocator a plain
``RuntimeError`` whose text names it ("[enforce fail at alloc_cpu.cpp:127] err == 0.
DefaultCPUAllocator: can't allocate memory: you tried to allocate 400000000 bytes. Error code 12
(Cannot allocate memory)", checked under ``RLIMIT_AS``; older builds say "not enough memory"); CUDA
libraries a ``RuntimeError`` with "CUDA error: out of memory" or cuDNN's
"CUDNN_STATUS_NOT_SUPPORTED" (its workspace: Accelerate counts it too); Python's own allocations
``MemoryError``; MPS, XPU and HPU their own words. Every phrase of Accelerate's
``should_reduce_batch_size`` is here, so aikit's integrations use this matcher in its place.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util

import torch

# POSIX only (no address-space limit to tell elsewhere); found, not caught: aikit.optional is the
# one place that turns a missing import into a message
resource = importlib.import_module("resource") if importlib.util.find_spec("resource") else None

_WORDS = (
    "DefaultCPUAllocator: can't allocate memory",  # the CPU allocator (torch 2.13)
    "DefaultCPUAllocator: not enough memory",  # the same, older builds
    " out of memory",  # CUDA, HIP, XPU ("CUDA out of memory.", "CUDA error: out of memory")
    "MPS backend out of memory",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN when its workspace cannot be allocated
    "MODULE:PT_DEVMEM Allocation failed",  # Intel Gaudi (HPU), as Accelerate's matcher has it
)


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocator's failure: a smaller batch may fit."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(words in str(error) for words in _WORDS)


def free(device: torch.device | None = None) -> None:
    """Give back what a failed step held: Python's cycles (the failed frames' tensors, once the
    error is gone) and CUDA's cached blocks, so the next try starts from the same memory."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()


def described(error: BaseException) -> str:
    """The allocator's own words, first line (what it tried to allocate)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def capacity(device: torch.device) -> str:
    """How much memory ``device`` has, for a message ("cuda:0: 2.10 of 79.19 GiB free"); the
    CPU's limit is the process's (``RLIMIT_AS``), or its RAM."""
    if device.type == "cuda":
        free_bytes, total = torch.cuda.mem_get_info(device)
        return f"{device}: {free_bytes / 2**30:.2f} of {total / 2**30:.2f} GiB free"
    soft = resource.getrlimit(resource.RLIMIT_AS)[0] if resource is not None else None
    if soft is None or soft == resource.RLIM_INFINITY:
        return f"{device}"
    return f"{device}: the process's address space limited to {soft / 2**30:.2f} GiB (RLIMIT_AS)"
