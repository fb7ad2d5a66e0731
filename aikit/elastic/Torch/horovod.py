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
accumulate locally with no communication; during the update's last backward, buckets of final
gradients start their ``hvd.allreduce_async_`` (as Horovod's hooks do), and ``step()`` adds the
sample count to the last one and waits, so every update, the epoch's last, short one included,
is the mean over the samples it actually saw. Clipping, AMP unscaling and the LR scheduler then
see the reduced gradient, as in a single-process big-batch step.

``broadcast_state`` replaces ``hvd.broadcast_parameters`` + ``hvd.broadcast_optimizer_state``:
the latter initialises a fresh optimizer's state by calling ``step()`` on zero gradients, which
advances Adam's step count and applies weight decay once before training starts.

Horovod elastic: ``hvd.elastic.TorchState(model=model, optimizer=optimizer, ...)`` takes the
``DistributedOptimizer`` as it is. Building an aikit GA optimizer under Horovod (this module's
``DistributedOptimizer`` or ``aikit.ga.Torch.optim.Optimizer``), or calling
:func:`broadcast_state`, puts a handler for aikit's GA optimizers in Horovod's state-handler
registry (its documented extension point; local, no collective): commits save the wrapper's
whole ``state_dict()`` (inner state, GA position, pending gradients), a restore loads it, and a
sync gives every worker rank 0's, as :func:`broadcast_state` does, where Horovod's own handler
would call ``broadcast_optimizer_state``. The world size is read at every update, so after a
resize the update averages over the new world; re-plan ``steps`` for it
(``optimizer.steps = aikit.elastic.Torch.init(G, M).steps``) at the top of the elastic function.
"""

from __future__ import annotations

from typing import Any

import torch

from aikit.core.errors import InvalidState, InvalidType
from aikit.ga.Torch.optim import Optimizer
from aikit.optional import require
from aikit.runtime.Torch import collectives, distributed

require("horovod.torch", "aikit.elastic.Torch.horovod", "use torchrun + DDP")  # the engine reads it, once initialised

__all__ = ["DistributedOptimizer", "broadcast_state"]


def _check_initialised() -> None:
    if distributed.horovod() is None:
        raise InvalidState("Horovod is not initialised: call horovod.torch.init() before aikit's Horovod glue")


class DistributedOptimizer(Optimizer):
    """``aikit.ga.Torch.optim.Optimizer(..., reduce=True)`` on Horovod: the update first sums the
    gradients and the samples over the ranks, in buckets started during the last backward.

    Takes the GA wrapper's arguments (``steps``, ``global_batch_size``, ``max_grad_norm``,
    ``scaler``, ``bucket_cap_mb``) and trains the same way: ``with optimizer.accumulate(model, samples=len(x))``
    around each micro-step's backward (or plain equal micro-batches), ``optimizer.step()`` after
    it. Call :meth:`flush` at the end of an epoch whose last window holds fewer micro-steps.
    Every rank must make the same number of ``step()`` calls; a rank with an empty micro-batch
    still calls ``step()`` (with ``samples=0``) and joins the all-reduce with zero gradients.
    The world size is read at every update, so a Horovod elastic resize scales right.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int, **ga_options: Any) -> None:
        _check_initialised()
        if "reduce" in ga_options:
            raise InvalidType("DistributedOptimizer always reduces at the update: leave out reduce=")
        super().__init__(optimizer, steps, reduce=True, **ga_options)  # registers it with TorchState


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s parameters, buffers and optimizer state (GA position
    included): call it once after building (or loading a checkpoint on rank 0 only)."""
    _check_initialised()
    distributed.current().keep_whole(Optimizer)  # for a GA optimizer built before hvd.init(): kept whole
    if distributed.world_size() == 1:
        return
    with torch.no_grad():
        collectives.broadcast_(list(model.state_dict().values()), src=root_rank)
    if optimizer is not None:
        optimizer.load_state_dict(collectives.broadcast_object(optimizer.state_dict(), "the optimizer state",
                                                               root_rank))
