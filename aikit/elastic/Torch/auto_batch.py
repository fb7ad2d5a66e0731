"""The largest per-device batch that fits, found by running the user's step, and the plan kept under out-of-memory.

Accelerate's ``find_executable_batch_size`` retries the user's function at 0.9 x the batch after
an out-of-memory error and leaves the GA steps to the user (its example's ``observed // batch``
turns a global batch of 128 into 115); the Hugging Face Trainer's ``auto_find_batch_size`` does
not rescale GA at all. Here every size tried is the device batch of a plan of the same global
batch (:func:`aikit.core.device_batch.device_batches`), so what is found is a plan: the global
batch unchanged, the GA steps and micro-batches (ragged where the policy allows) from it, the
LR untouched.

* :func:`find_device_batch` (what ``init(G, "auto", trial=step)`` runs): the user's ``trial(b)``
  at the largest candidate, smaller after each out-of-memory error (memory freed between tries),
  in few tries (:func:`aikit.core.device_batch.largest_fitting`); every replica then runs the
  smallest any found, agreed in one all-reduce that every replica issues.
* :class:`AutoBatch`: one update's samples run as the plan's micro-batches; an out-of-memory
  error in the middle of training (a longer batch) drops the update's micro-steps, re-plans at
  the next smaller device batch and runs the whole update again, so no sample is lost or counted
  twice (one process: replicas could only agree on a new plan in a collective all issue).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from aikit.core.device_batch import Search, agreed, device_batches, largest_fitting, smaller_plan, steps_note
from aikit.core.errors import InvalidType, InvalidValue, OutOfMemory
from aikit.core.plan import Plan, make_plan, micro_batch_slices
from aikit.core.validate import callable_with, positive_int
from aikit.runtime.process import TORCH, plan_of
from aikit.runtime.Torch import collectives, distributed, memory

log = logging.getLogger("aikit.elastic")


def find_device_batch(global_batch_size: int, devices: int, policy: str, trial: Callable[[int], Any],
                      candidates: Iterable[int] | None = None) -> tuple[int, Search]:
    """The largest per-device batch at which ``trial(batch)`` (one forward and backward of the
    user's, on the largest inputs the run will see) runs out of memory on no replica, and the
    search that found it (its tries and their cost). Every replica must call it."""
    callable_with(trial, "init(..., 'auto', trial=)", "trial(device_batch)",
                  "max_device_batch='auto' needs trial=, a function that runs one forward and backward of yours at "
                  "the per-device batch it is given: def trial(batch): ...")
    sizes = device_batches(global_batch_size, devices, policy, candidates)
    said: dict[int, str] = {}

    def fits(size: int) -> bool:
        failed = None
        try:
            trial(size)
        except Exception as error:  # the user's step: an out-of-memory error is an answer, any other raised
            if not memory.out_of_memory(error):
                raise
            failed = memory.described(error)
        memory.free()  # after the except block: the error's frames (and the tensors they hold) are gone
        if failed is not None:
            said[size] = failed
        return failed is None

    search = largest_fitting(sizes, fits)
    found = _agreed(search.found)
    if found is None:
        here = f"even per-device batch {sizes[-1]}" if search.found is None else "another replica's smallest"
        raise OutOfMemory(
            f"no per-device batch of global batch {global_batch_size} fits: {here} ran out of memory "
            f"({said.get(sizes[-1], 'on another replica')}; {memory.capacity(_device())}); tried {search.summary()}. "
            "Free memory (a smaller model, activation checkpointing, bf16, a shorter sequence) or give "
            "max_device_batch a number to fail at the step itself")
    if distributed.rank() == 0:
        chosen = make_plan(global_batch_size, found, devices, policy=policy)
        log.info("auto batch: per-device batch %d fits (%s): %s, global batch %d kept", found, search.summary(),
                 steps_note(chosen), global_batch_size)
    return found, search


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_initialized() else torch.device("cpu")


def _agreed(found: int | None) -> int | None:
    """The smallest per-device batch any replica found (None: one found none), in one all-reduce."""
    replicas, rank = collectives.world()
    if replicas == 1:
        return found
    table = torch.zeros(replicas, dtype=torch.float64, device=_device())
    table[rank] = found or 0
    collectives.all_reduce_sum_([table])
    return agreed(int(f) or None for f in table.tolist())


class AutoBatch:
    """Runs each update's window of ``plan.global_batch_size`` samples as this replica's
    micro-batches of the plan through the aikit GA ``optimizer`` (built with
    ``global_batch_size``: each micro-batch weighs its samples); on an out-of-memory error the
    update's micro-steps are dropped, the plan steps to the next smaller device batch and the
    update runs again from its first micro-batch. ``loss_fn(*tensors)`` returns a micro-batch's
    mean loss; :meth:`update` returns the window's mean loss (a tensor, not read)."""

    def __init__(self, optimizer: Any, model: torch.nn.Module | None = None, plan: Plan | None = None) -> None:
        plan = plan_of(TORCH) if plan is None else plan
        if plan is None:
            raise InvalidValue("AutoBatch follows init()'s plan: call aikit.elastic.Torch.init(global_batch_size, "
                               "'auto', trial=...) first, or pass plan=")
        if not hasattr(optimizer, "restart") or optimizer.global_batch_size != plan.global_batch_size:
            raise InvalidValue(
                f"AutoBatch needs the aikit GA optimizer built with global_batch_size={plan.global_batch_size} "
                f"(its micro-batches weigh their samples), got {type(optimizer).__name__} with "
                f"global_batch_size={getattr(optimizer, 'global_batch_size', None)}: "
                f"aikit.ga.Torch.optim.Optimizer(optimizer, plan.micro_steps, "
                f"global_batch_size={plan.global_batch_size})")
        self.optimizer, self.model, self.plan = optimizer, model, plan
        self.optimizer.steps = plan.micro_steps
        self.updates = 0  # updates run to their end
        self.replans: list[tuple[int, int, int, str]] = []  # (update, device batch, new device batch, the error)

    def update(self, loss_fn: Callable[..., torch.Tensor], *window: torch.Tensor) -> torch.Tensor:
        """One update on ``window`` (tensors of ``global_batch_size`` samples, the same on every replica)."""
        while True:
            failed = None
            try:
                loss = self._run(loss_fn, window)
                self.updates += 1
                return loss
            except Exception as error:  # the user's loss: an out-of-memory error re-plans, any other raised
                if not memory.out_of_memory(error):
                    self.optimizer.restart()  # the failed update leaves no micro-step behind
                    raise
                failed = memory.described(error)
            self.optimizer.restart()
            memory.free()
            self._replan(failed)

    def _run(self, loss_fn: Callable[..., torch.Tensor], window: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if not window or any(len(t) != self.plan.global_batch_size for t in window):
            raise InvalidValue(f"update() takes tensors of one window of {self.plan.global_batch_size} samples, got "
                               f"lengths {[len(t) for t in window]}")
        total, seen = 0.0, 0
        for part in micro_batch_slices(self.plan, None if distributed.world_size() == 1 else distributed.rank()):
            samples = part.stop - part.start
            with self.optimizer.accumulate(self.model, samples=samples):
                if samples:
                    loss = _mean_loss(loss_fn(*(t[part] for t in window)))
                    loss.backward()
                    total, seen = total + loss.detach() * samples, seen + samples
            self.optimizer.step()
        return total / max(seen, 1)

    def _replan(self, failed: str) -> None:
        old, smaller = self.plan, smaller_plan(self.plan)
        if smaller is None or distributed.world_size() > 1:
            why = ("even per-device batch 1 ran out of memory" if smaller is None else
                   f"the {distributed.world_size()} replicas cannot agree on a smaller plan here (no collective "
                   "all issue): restart from the last commit, where init's auto search runs again")
            raise OutOfMemory(f"update {self.updates}: {failed} at per-device batch {old.device_batch} "
                              f"({memory.capacity(_device())}); {why}")
        self.plan = smaller
        self.optimizer.steps = smaller.micro_steps
        self.replans.append((self.updates, old.device_batch, smaller.device_batch, failed))
        log.warning("auto batch: update %d ran out of memory at per-device batch %d (%s): re-planned to %s "
                    "(global batch %d kept); the update runs again from its first micro-batch", self.updates,
                    old.device_batch, failed, steps_note(smaller), smaller.global_batch_size)

    def state_dict(self) -> dict[str, int]:
        return {"device_batch": self.plan.device_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """A resumed run keeps the plan this machine's search found; a saved device batch that no
        longer fits (larger than it) is said once."""
        if not isinstance(state, dict) or set(state) != {"device_batch"}:
            raise InvalidValue(f"AutoBatch.load_state_dict takes what AutoBatch.state_dict() gave, "
                               f"{{'device_batch': n}}, got {state!r:.100}")
        saved = positive_int(state["device_batch"], "AutoBatch state_dict()['device_batch']")
        if saved > self.plan.device_batch:
            log.warning("auto batch: the run was saved at per-device batch %d, which no longer fits here: "
                        "re-planned to %s (global batch %d kept)", saved, steps_note(self.plan),
                        self.plan.global_batch_size)


def _mean_loss(loss: Any) -> torch.Tensor:
    """``loss_fn``'s result if it is one micro-batch's mean loss, a 0-d tensor to run backward on
    (each micro-batch is then weighed by its samples); else the aikit error that says what it got."""
    if not isinstance(loss, torch.Tensor):
        raise InvalidType(f"AutoBatch's loss_fn must return the micro-batch's mean loss as a tensor computed from "
                          f"the model (its backward trains it), got {type(loss).__name__} {loss!r:.60}: return the "
                          "loss tensor itself, not loss.item() or a number")
    if loss.dim() != 0:
        raise InvalidValue(f"AutoBatch's loss_fn must return the micro-batch's mean loss (a 0-d tensor), got a tensor "
                           f"of shape {tuple(loss.shape)}: return its mean, e.g. F.cross_entropy(..., "
                           "reduction='mean'), which AutoBatch weighs by the micro-batch's samples")
    return loss
