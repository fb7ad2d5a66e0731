"""Horovod elastic's protocol, for :class:`~aikit.elastic.Torch.resize.ElasticState`.

Under ``horovodrun --min-np/--max-np`` the workers that survive a join or a leave stay alive:
``hvd.elastic.run`` calls the state's ``sync()`` after every reset, ``on_reset()`` once the
world is formed again, ``on_hosts_updated()`` when its driver sees hosts come or go, and takes
callbacks through ``register_reset_callbacks()``. :class:`HorovodElastic` is what those methods
of ElasticState keep and do; a commit checks, with every worker, whether hosts changed (a
collective, so every worker must commit equally often). Horovod is imported only when used.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.runtime.Torch import distributed


def horovod_elastic() -> bool:
    """True in a worker that ``horovodrun --min-np/--max-np`` started (Horovod elastic mode)."""
    return distributed.current().elastic()


class HorovodElastic:
    """The reset callbacks and Horovod's own State (its host-update bookkeeping, which the
    driver notifies) of one ElasticState."""

    def __init__(self) -> None:
        self.reset_callbacks: list[Callable[[], object]] = []
        self._state = None

    def state(self):
        """Horovod's own State, made at its first use."""
        if self._state is None:
            from horovod.common.elastic import State

            hvd = distributed.horovod()
            self._state = State(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
        return self._state

    def on_hosts_updated(self, timestamp, update_res) -> None:
        self.state().on_hosts_updated(timestamp, update_res)

    def on_reset(self, replan: Callable[[], None]) -> None:
        """Forget the host updates of the old world, re-deal with ``replan``, then the callbacks."""
        self.state()._host_messages = queue.Queue()
        replan()
        for callback in self.reset_callbacks:
            callback()

    def after_commit(self, optimizer) -> None:
        """Under Horovod elastic, with every worker: stop for a resize when hosts changed."""
        if horovod_elastic():
            check_every_worker_commits(optimizer)
            self.state().check_host_updates()


def check_every_worker_commits(optimizer) -> None:
    """Horovod's host check is a collective, so every worker must commit equally often; a
    worker with no micro-batch in a step makes that update inside another ``step()`` call
    and would commit less often than the others (``optimizer``: the trace optimizer, or None)."""
    if optimizer is None:
        return
    plan, workers = optimizer.epoch_schedule, distributed.world_size()
    short = np.flatnonzero(plan.micro_batches_per_step < workers)
    if short.size:
        step = int(short[0])
        raise InvalidValue(
            f"under Horovod elastic every worker must get a micro-batch in every step, but step {step} of "
            f"epoch {plan.epoch} (global batch {int(plan.batch_sizes[step])}) has "
            f"{int(plan.micro_batches_per_step[step])} micro-batch(es) of {plan.micro_size(step)} for {workers} "
            f"workers: use a micro_batch that divides every batch size and is at most "
            f"{int(plan.batch_sizes.min())} / (--max-np)"
        )
