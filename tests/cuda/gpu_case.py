"""What the GPU check's tests share: exact arithmetic on each device, small models and data made
on the device, the big-batch references the tests compare with, and the host syncs of CUDA.

Only torch, numpy and aikit's public names are imported here and in the tests: scripts/gpu_check.sh
runs tests/cuda on the GPU image (no TensorFlow, no sybil, none of the test suite's other packages)
with ``--confcutdir tests/cuda``, so neither the root conftest.py nor tests/conftest.py loads.
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from aikit.datasets import IGNORE

NO_CUDA = ("no CUDA device here (torch.cuda.is_available() is False): this case runs on a GPU machine, "
           "bash scripts/gpu_check.sh")


def require_cuda() -> None:
    """Skip a CUDA case where there is no GPU, or fail it under ``AIKIT_REQUIRE_CUDA=1`` (the GPU
    check sets it: a machine whose GPU torch cannot see must not pass as skips)."""
    if torch.cuda.is_available():
        return
    if os.environ.get("AIKIT_REQUIRE_CUDA") == "1":
        pytest.fail(f"AIKIT_REQUIRE_CUDA=1 but {NO_CUDA}")
    pytest.skip(NO_CUDA)


@contextlib.contextmanager
def exact(device: torch.device) -> Iterator[torch.dtype]:
    """The most exact arithmetic of ``device``: float64 on the CPU; float32 with TF32 off on CUDA
    (float64 there would test kernels nobody trains with)."""
    if device.type != "cuda":
        yield torch.float64
        return
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch >= 2.9 prefers its fp32_precision settings
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield torch.float32
    finally:
        torch.set_float32_matmul_precision(precision)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.backends.cudnn.allow_tf32 = cudnn


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close's tolerance for two sums of the same terms in another order."""
    return {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-6}


def gradient_tolerance(dtype: torch.dtype) -> float:
    """The largest relative error (norm) of an update's gradient summed in another order."""
    return 1e-12 if dtype == torch.float64 else 1e-5


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten().cpu() for t in tensors])


def relative_error(got, want) -> float:
    return ((flat(got) - flat(want)).norm() / flat(want).norm()).item()


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (FSDP2), or the tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


# --- models and data ------------------------------------------------------------------------
FEATURES, VOCAB = 8, 11


def mlp(device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0,
        dropout: float = 0.0) -> torch.nn.Module:
    """A regression MLP (8 inputs, 4 outputs)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                              torch.nn.Dropout(dropout), torch.nn.Linear(16, 4))
    return net.to(device=device, dtype=dtype)


def regression(samples: int, device: torch.device, dtype: torch.dtype = torch.float32,
               seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen, dtype=torch.float64)
    y = torch.stack([x[:, :4].sum(1).sin(), x[:, 4:].prod(1).tanh(), x[:, 0] * x[:, 1], x.norm(dim=1)], 1)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


class TokenModel(torch.nn.Module):
    """A per-token classifier of float features (a language model's head without the embedding,
    whose CUDA backward reads the device: the no-sync test must see only aikit's syncs)."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.block = torch.nn.Sequential(torch.nn.Linear(FEATURES, width), torch.nn.GELU(),
                                         torch.nn.LayerNorm(width))
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def token_model(device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0) -> TokenModel:
    torch.manual_seed(seed)
    return TokenModel().to(device=device, dtype=dtype)


def token_batches(device: torch.device, dtype: torch.dtype = torch.float32, micro_batches: int = 4,
                  sequences: int = 2, length: int = 12, seed: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches of padded sequences whose labels hold very different numbers of tokens
    (1 to all of them per sequence; the rest ``IGNORE``): the mean of the micro-batch means is
    then far from the mean over the update's tokens."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for index in range(micro_batches):
        x = torch.randn(sequences, length, FEATURES, generator=gen, dtype=torch.float64)
        labels = torch.randint(0, VOCAB, (sequences, length), generator=gen)
        kept = 1 + (index * 5 + torch.arange(sequences) * 7) % length  # tokens kept per sequence
        labels[torch.arange(length)[None, :] >= kept[:, None]] = IGNORE
        batches.append((x.to(device=device, dtype=dtype), labels.to(device)))
    return batches


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross entropy over the tokens whose label is not ``IGNORE``, written from
    element-wise ops and sums: nothing in it reads the device (F.cross_entropy's CUDA kernels
    may), so a host sync seen around it is aikit's."""
    logp = torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, -1)
    kept = labels != IGNORE
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * kept).sum() / kept.sum()


def tokens(labels: torch.Tensor) -> torch.Tensor:
    """The micro-batch's loss terms as users count them: a 0-d int64 tensor on the labels' device."""
    return (labels != IGNORE).sum()


def concatenated(batches):
    return tuple(torch.cat(parts) for parts in zip(*batches, strict=True))


# --- references -----------------------------------------------------------------------------
def first_update_gradient(inner: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Filled with the gradient the wrapped optimizer steps on in its first update (weighed,
    unscaled and clipped: a step pre-hook runs inside its ``step()``)."""
    seen: list[torch.Tensor] = []

    def record(*_) -> None:
        if not seen:
            seen.extend(whole(p.grad).detach().clone() for group in inner.param_groups for p in group["params"])

    inner.register_step_pre_hook(record)
    return seen


def lrs_of_updates(inner: torch.optim.Optimizer) -> list[float]:
    """Filled with the first group's LR at every real step of ``inner``."""
    lrs: list[float] = []
    inner.register_step_pre_hook(lambda *_: lrs.append(inner.param_groups[0]["lr"]))
    return lrs


def big_batch_run(model: torch.nn.Module, inner: torch.optim.Optimizer, updates, loss_fn,
                  max_grad_norm: float | None = None) -> list[torch.Tensor]:
    """Real big-batch steps: one forward of each update's concatenated micro-batches, one
    ``step()``; returns the first update's gradient."""
    first = None
    for micro_batches in updates:
        inner.zero_grad()
        x, y = concatenated(micro_batches)
        loss_fn(model(x), y).backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if first is None:
            first = [p.grad.detach().clone() for p in model.parameters()]
        inner.step()
    return first


def twin(model: torch.nn.Module) -> torch.nn.Module:
    """An independent copy with the same weights (the reference run's model)."""
    return copy.deepcopy(model)


# --- host syncs on CUDA ---------------------------------------------------------------------
@contextlib.contextmanager
def no_host_sync(device: torch.device) -> Iterator[None]:
    """Raise at the first operation that waits for the GPU (CUDA; elsewhere nothing to check)."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@contextlib.contextmanager
def counted_host_syncs() -> Iterator[list[str]]:
    """Yields a list that receives, when the block ends, ``file:line`` of every host sync
    made in it (CUDA's sync debug mode warns at each; the warning names the Python line)."""
    found: list[str] = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    found.extend(f"{w.filename}:{w.lineno}" for w in caught if "synchronizing" in str(w.message))


def mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(prediction.float() if prediction.dtype == torch.float16 else prediction, target)
