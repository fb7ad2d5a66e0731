"""Horovod glue: GA with one all-reduce per update, and replicas that start equal.

Launch with ``horovodrun -np 4 python train.py`` (``--gloo`` where there is no MPI) and write::

    import horovod.torch as hvd
    import aikit.elastic.Torch
    from aikit.elastic.Torch import horovod

    hvd.init()
    aikit.elastic.Torch.init(256, 64)          # gpus = hvd.size(), master = (hvd.rank() == 0)
    optimizer = horovod.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             aikit.elastic.Torch.steps)
    horovod.broadcast_state(model, optimizer)  # every rank starts from rank 0's weights

Why not ``hvd.DistributedOptimizer(backward_passes_per_step=k)`` under the GA wrapper: Horovod
starts its all-reduce from a backward hook while the GA wrapper is about to average and clip the
same ``.grad`` tensors, it asserts when an epoch ends in a window of another length
(horovod#2497), and it averages over ranks however many samples each held. Here the ranks
accumulate locally with no communication, and the update starts with a single grouped all-reduce
of the gradients and of the sample count, so every update, the epoch's last, short one included,
is the mean over the samples it actually saw. Clipping, AMP unscaling and the LR scheduler then
see the reduced gradient, as in a single-process big-batch step.

``broadcast_state`` replaces ``hvd.broadcast_parameters`` + ``hvd.broadcast_optimizer_state``:
the latter initialises a fresh optimizer's state by calling ``step()`` on zero gradients, which
advances Adam's step count and applies weight decay once before training starts.
"""

from __future__ import annotations

from typing import Any

import torch

from aikit.elastic.Torch.collectives import all_reduce_sum_, broadcast_
from aikit.ga.Torch.optim import Optimizer

try:
    import horovod.torch as hvd
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"aikit.elastic.Torch.horovod needs Horovod's PyTorch part ({error}): build it with "
        "scripts/install_horovod.sh (Horovod 0.28.1, PyTorch + gloo), or use torchrun + DDP"
    ) from error

__all__ = ["DistributedOptimizer", "broadcast_state"]


def _check_initialised() -> None:
    if not hvd.is_initialized():
        raise RuntimeError("Horovod is not initialised: call horovod.torch.init() before aikit's Horovod glue")


class DistributedOptimizer(Optimizer):
    """``aikit.ga.Torch.optim.Optimizer`` whose update first sums gradients over Horovod ranks.

    Takes the GA wrapper's arguments (``steps``, ``global_batch_size``, ``max_grad_norm``,
    ``scaler``) and trains the same way: ``with optimizer.accumulate(model, samples=len(x))``
    around each micro-step's backward (or plain equal micro-batches), ``optimizer.step()`` after
    it. Call :meth:`flush` at the end of an epoch whose last window holds fewer micro-steps.
    Every rank must make the same number of ``step()`` calls; a rank with an empty micro-batch
    still calls ``step()`` (with ``samples=0``) and joins the all-reduce with zero gradients.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int, **ga_options: Any) -> None:
        _check_initialised()
        super().__init__(optimizer, steps, **ga_options)

    def flush(self) -> bool:
        """Update now on the micro-steps accumulated so far (an epoch's last, shorter window);
        True if it updated. Every rank must call it at the same point."""
        if self.position == 0:
            return False
        self.updated = self._update()
        return self.updated

    def _update(self) -> bool:
        self._all_reduce()
        return super()._update()

    @torch.no_grad()
    def _all_reduce(self) -> None:
        """Sum gradients and declared samples over the ranks in one grouped all-reduce, then scale
        them to what one process that saw every sample of this window would hold."""
        size = hvd.size()
        params = [p for p in self._params() if p.requires_grad]
        if size == 1 or not params:
            return self._rescale(params, float(self._samples))
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        counts = torch.tensor(  # on the gradients' device: a Horovod group shares one device
            [float(self._samples), *(float(p.grad is not None) for p in params)],
            dtype=torch.float64,
            device=params[0].device,
        )
        all_reduce_sum_([*grads, counts])
        torch._foreach_mul_(grads, 1.0 / size)
        for p, grad, used in zip(params, grads, counts[1:].tolist(), strict=True):
            p.grad = grad if used else None  # no rank touched it: no gradient, as in one process
        self._rescale(params, counts[0].item())

    def _rescale(self, params: list[torch.Tensor], samples: float) -> None:
        """With declared samples, each gradient was weighted by n * size / G: make the update the
        mean over the ``samples`` the window held over all ranks (G for a full window)."""
        if not self._weighted or samples == 0:
            return
        total = self._global_batch_size(int(samples))
        if samples != total:
            torch._foreach_mul_([p.grad for p in params if p.grad is not None], total / samples)
            self._samples = total  # the gradient now stands for a full window's mean


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s parameters, buffers and optimizer state (GA position
    included): call it once after building (or loading a checkpoint on rank 0 only)."""
    _check_initialised()
    if hvd.size() == 1:
        return
    with torch.no_grad():
        broadcast_(list(model.state_dict().values()), src=root_rank)
    if optimizer is not None:
        optimizer.load_state_dict(hvd.broadcast_object(optimizer.state_dict(), root_rank=root_rank))
