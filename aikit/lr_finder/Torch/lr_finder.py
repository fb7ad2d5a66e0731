"""The LR range test for PyTorch: a drop-in for torch-lr-finder 0.2.2's ``LRFinder``.

Same constructor, ``range_test``, ``history``, ``reset`` and ``plot``, and the same LRs and
losses bit for bit. On top: mixed precision through ``torch.amp``, a NaN or infinite loss
stops the test, suggestion methods by name, CSV history, and data parallelism under every
engine aikit detects (torch.distributed, Horovod, XLA replicas: every rank uses rank 0's LRs
and records the rank-averaged loss). The loop, LR sequence, smoothing, stop rule and
suggestions are ``aikit.core.lr_range``'s; this module trains one update and validates, in
torch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader

from aikit.core import lr_range
from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.validate import positive_int
from aikit.lr_finder.Torch.data import DataLoaderIter, TrainDataLoaderIter, ValDataLoaderIter, criterion_failed
from aikit.runtime.range_results import RangeTestResults
from aikit.runtime.state_cache import StateCache
from aikit.runtime.Torch import collectives, distributed
from aikit.runtime.Torch.amp import amp_step_read
from aikit.runtime.Torch.gradient_sync import sync_skipper
from aikit.runtime.Torch.lr_free import SCHEDULE_FREE, STEP_SIZE_ESTIMATOR, eval_weights, in_train_mode, lr_free_kind
from aikit.runtime.Torch.wrapping import WrappingOptimizer

# The names torch_lr_finder.lr_finder has, for users who import from the module.
__all__ = ["DataLoaderIter", "LRFinder", "StateCacher", "TrainDataLoaderIter", "ValDataLoaderIter"]


class LRFinder(RangeTestResults):
    """Learning rate range test (Smith, 2017; fastai's tweak).

    ``optimizer``'s LR (or ``range_test``'s ``start_lr``) is the lower bound. The model and
    optimizer are cached now (in memory, or under ``cache_dir`` with ``memory_cache=False``)
    so that ``reset()`` can restore them. ``device`` defaults to the model's.
    ``amp_backend="torch"`` runs forward passes under ``torch.amp.autocast(**amp_config)``
    (``amp_config`` defaults to the device's type) and scales losses with ``grad_scaler``.

    Example::

        finder = LRFinder(model, optimizer, criterion)
        finder.range_test(train_loader, end_lr=10, num_iter=100)
        ax, lr = finder.plot()
        finder.reset()
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, criterion,
                 device: str | torch.device | None = None, memory_cache: bool = True, cache_dir: str | None = None,
                 amp_backend: str | None = None, amp_config: dict | None = None,
                 grad_scaler: torch.amp.GradScaler | None = None):
        if isinstance(optimizer, WrappingOptimizer) and optimizer.follows_trace:
            raise InvalidType(
                f"optimizer is an aikit {optimizer.kind}, whose updates follow its sampler's batch-size trace, so "
                "the range test's LRs would not match its losses: pass the wrapped optimizer, "
                "LRFinder(model, optimizer.optimizer, criterion), with a loader of the global batch"
            )
        if _is_ga(optimizer):
            grad_scaler = self._ga_scaler(optimizer, amp_backend, grad_scaler)
        _check_lr_free(optimizer)
        self.optimizer = optimizer
        self._check_for_scheduler()
        self.model = model
        self.criterion = criterion
        self.history = {"lr": [], "loss": []}
        self.best_loss = None
        self.memory_cache = memory_cache
        self.cache_dir = cache_dir

        if amp_backend not in (None, "torch"):
            raise InvalidValue(
                f"Unknown amp backend: {amp_backend!r}; aikit supports amp_backend='torch' "
                "(torch.amp autocast + GradScaler) in place of apex"
            )
        if amp_backend == "torch" and grad_scaler is None and not _is_ga(optimizer):
            raise InvalidValue(
                "`grad_scaler` is required when using `torch.amp`: pass "
                "grad_scaler=torch.amp.GradScaler('cuda') (or 'cpu')"
            )
        self.amp_backend = amp_backend
        self.amp_config = amp_config
        self.grad_scaler = grad_scaler
        # what scales each micro-batch's loss: a GA optimizer's own scaler, else grad_scaler under amp
        self._loss_scaler = grad_scaler if amp_backend or _is_ga(optimizer) else None

        first = next(self.model.parameters(), None)
        if first is None:
            raise InvalidValue("the model has no parameters: the range test trains them, so give it a model with "
                               "parameters (and an optimizer over them)")
        self.model_device = first.device
        self.state_cacher = StateCacher(memory_cache, cache_dir=cache_dir)
        self.state_cacher.store("model", self.model.state_dict())
        self.state_cacher.store("optimizer", self.optimizer.state_dict())
        if grad_scaler is not None:
            self.state_cacher.store("grad_scaler", grad_scaler.state_dict())
        self._applied = getattr(optimizer, "applied", None)  # a GA optimizer's count of updates (for schedulers)
        self.device = device if device else self.model_device

    def reset(self) -> None:
        """Restore the model, the optimizer (state and every group's LR; a GA optimizer's position
        and update count too) and the grad scaler."""
        self.model.load_state_dict(self.state_cacher.retrieve("model"))
        self.optimizer.load_state_dict(self.state_cacher.retrieve("optimizer"))
        if self._applied is not None:
            self.optimizer.applied = self._applied
        if self.grad_scaler is not None:
            self.grad_scaler.load_state_dict(self.state_cacher.retrieve("grad_scaler"))
        self.model.to(self.model_device)

    @staticmethod
    def _ga_scaler(optimizer: WrappingOptimizer, amp_backend: str | None, grad_scaler):
        """The GradScaler of a range test through aikit's GA optimizer: the optimizer's own, which
        unscales and steps once per update (the finder scales each micro-batch's loss with it)."""
        if grad_scaler is not None and grad_scaler is not optimizer.scaler:
            raise InvalidValue(
                "the GA optimizer unscales, steps and updates the GradScaler once per update, so the range test "
                "uses the GA optimizer's own: build it with Optimizer(optimizer, steps, scaler=grad_scaler) and "
                "leave grad_scaler out of LRFinder"
            )
        if amp_backend == "torch" and optimizer.scaler is None:
            raise InvalidValue(
                "amp_backend='torch' through a GA optimizer without a GradScaler: build it with "
                "Optimizer(optimizer, steps, scaler=torch.amp.GradScaler(...))"
            )
        return optimizer.scaler

    def range_test(self, train_loader, val_loader=None, start_lr: float | list[float] | None = None, end_lr: float = 10,
                   num_iter: int = 100, step_mode: str = "exp", smooth_f: float = 0.05, diverge_th: float = 5,
                   accumulation_steps: int = 1, non_blocking_transfer: bool = True, *, progress_bar: bool = True,
                   val_average: str | None = None) -> None:
        """Train ``num_iter`` updates while the LR climbs to ``end_lr``; fill ``self.history``.

        Each param group climbs from its own LR (or ``start_lr``, a number or one per group)
        to ``end_lr``; ``history["lr"]`` records the first group's. The recorded loss is the
        training loss of the update (the mean over ``accumulation_steps`` micro-batches), or,
        with ``val_loader``, the validation loss, smoothed by ``smooth_f``: by default exactly
        torch-lr-finder's, the loss summed over the batches (each batch's mean times
        ``len(labels)``) divided by ``len(val_loader.dataset)``; ``val_average="seen"`` divides
        by the samples the loader actually yielded instead (the true per-sample mean when the
        loader's sampler covers only part of its data set). Under data parallelism (DDP, Horovod,
        XLA replicas; torch-lr-finder has none) every rank climbs through rank 0's LRs and
        records the mean over ranks; the default is ``"seen"``: the sum over every rank's
        batches divided by the samples all ranks validated on, whatever each rank's loader reads.
        The test stops after a loss above ``diverge_th`` times the best, or a non-finite one.
        The groups' LRs are put back afterwards; ``reset()`` restores the weights as well.
        """
        if collectives.per_update(self.device):  # TorchFT: every update its own quorum, which the test does not take
            raise InvalidState(
                "LRFinder.range_test() under TorchFT's replica groups, where every update is dealt after its own "
                "quorum: run the range test before group.start() (in one process, or under torchrun) and train the "
                "replica groups at the LR it suggests (docs/resize.md, No restart: TorchFT)")
        test = lr_range.RangeTest(self, self._start_lrs(start_lr), end_lr, num_iter, step_mode, smooth_f, diverge_th,
                                  validate=val_loader is not None, val_average=val_average,
                                  replicas=_Replicas(self.device), progress_bar=progress_bar)
        self._check_for_scheduler()
        accumulation_steps = positive_int(accumulation_steps, "accumulation_steps")
        if _is_ga(self.optimizer):
            self._check_ga(accumulation_steps)
        update = _Update(
            self,
            self._wrap(train_loader, "train_loader", DataLoader, TrainDataLoaderIter),
            None if val_loader is None else self._wrap(val_loader, "val_loader", DataLoader, ValDataLoaderIter),
            accumulation_steps,
            non_blocking_transfer,
        )
        self.model.to(self.device)
        with self._train_mode():
            test.run(update)

    @contextlib.contextmanager
    def _train_mode(self):
        """A Schedule-Free optimizer trains in train mode (its ``y``) and is left in the mode it was in."""
        switch = lr_free_kind(self.optimizer) == SCHEDULE_FREE and not in_train_mode(self.optimizer)
        if switch:
            self.optimizer.train()
        try:
            yield
        finally:
            if switch:
                self.optimizer.eval()

    # --- one iteration -------------------------------------------------------------------

    def _train_batch(self, train_iter, accumulation_steps: int, non_blocking_transfer: bool = True) -> float | None:
        """One update over ``accumulation_steps`` micro-batches (through a GA optimizer: its
        ``steps``); returns their mean loss, or None when AMP skipped the update for inf/NaN
        gradients with a finite loss (the range test then makes it again at the same LR)."""
        self.model.train()
        total_loss = None
        self.optimizer.zero_grad()
        ga = self.optimizer if _is_ga(self.optimizer) else None
        steps = accumulation_steps if ga is None else ga.steps
        for i in range(steps):
            inputs, labels = next(train_iter)
            inputs, labels = self._move_to_device(inputs, labels, non_blocking=non_blocking_transfer)
            with self._no_sync(last=i == steps - 1) if ga is None else ga.accumulate(self.model):
                with self._autocast():
                    loss = self._loss(self.model(inputs), labels, first=i == 0 and not self.history["lr"])
                if ga is None:  # a GA optimizer averages the micro-batches' gradients itself
                    loss = loss / steps
                (self._loss_scaler.scale(loss) if self._loss_scaler is not None else loss).backward()
            mean_part = loss.detach() if ga is None else loss.detach() / steps
            total_loss = mean_part if total_loss is None else total_loss + mean_part
            if ga is not None:
                ga.step()
        if ga is not None:
            stepped = ga.updated
        elif self._loss_scaler is not None:
            stepped = amp_step_read(self.grad_scaler, self.optimizer)  # False: inf/NaN gradients, skipped
        else:
            self.optimizer.step()
            stepped = True
        loss = total_loss.item()
        return loss if stepped or not math.isfinite(loss) else None

    def _loss(self, outputs, labels, first: bool):
        """The criterion on a batch; where it fails on the test's first batch (a criterion that does
        not fit the model's outputs or the loader's labels), its error says so, with the shapes."""
        if not first:
            return self.criterion(outputs, labels)
        try:
            return self.criterion(outputs, labels)
        except Exception as error:  # the user's criterion: any error, named, with the shapes added
            raise criterion_failed(error, outputs, labels) from error

    def _validation_totals(self, val_iter, non_blocking_transfer: bool = True) -> tuple[float, int]:
        """This rank's validation loss summed over its batches (each batch's mean times
        ``len(labels)``, as torch-lr-finder counts) and the samples they held."""
        running_loss, samples = 0.0, 0
        self.model.eval()
        with torch.no_grad():
            for inputs, labels in val_iter:
                inputs, labels = self._move_to_device(inputs, labels, non_blocking=non_blocking_transfer)
                loss = self.criterion(self.model(inputs), labels)
                running_loss += loss.item() * len(labels)
                samples += len(labels)
        return running_loss, samples

    def _no_sync(self, last: bool):
        """A wrapped model (DDP) syncs gradients only on the last micro-batch of an update."""
        skip = None if last else sync_skipper(self.model)
        return contextlib.nullcontext() if skip is None else skip()

    def _autocast(self):
        if self.amp_backend != "torch":
            return contextlib.nullcontext()
        config = self.amp_config or {"device_type": torch.device(self.device).type}
        return torch.amp.autocast(**config)

    def _move_to_device(self, inputs, labels, non_blocking: bool = True):
        return _move(inputs, self.device, non_blocking), _move(labels, self.device, non_blocking)

    # --- setup ----------------------------------------------------------------------------

    def _check_ga(self, accumulation_steps: int) -> None:
        """A range test through a GA optimizer: one update per ``optimizer.steps`` micro-batches."""
        if accumulation_steps != 1:
            raise InvalidValue(
                f"accumulation_steps={accumulation_steps} through a GA optimizer, which accumulates "
                f"optimizer.steps={self.optimizer.steps} micro-batches per update itself: leave accumulation_steps out"
            )
        if self.optimizer.micro_step:
            raise InvalidValue(
                f"the GA optimizer is {self.optimizer.micro_step} micro-steps into an update: run the range test "
                "between updates (optimizer.micro_step == 0)"
            )

    def _check_for_scheduler(self) -> None:
        for param_group in self.optimizer.param_groups:
            if "initial_lr" in param_group:
                raise InvalidState(
                    "Optimizer already has a scheduler attached to it; create the LRFinder "
                    "(and run the test) before creating the LR scheduler"
                )

    def _start_lrs(self, start_lr) -> list[float]:
        groups = self.optimizer.param_groups
        if start_lr is None:
            return [group["lr"] for group in groups]
        if not isinstance(start_lr, (list, tuple)):
            return [start_lr] * len(groups)
        if len(start_lr) != len(groups):
            raise InvalidValue(
                f"Length of `new_lrs` is not equal to the number of parameter groups in the "
                f"given optimizer: got {len(start_lr)} start LRs for {len(groups)} groups"
            )
        return list(start_lr)

    def _is_master(self) -> bool:
        return distributed.rank() == 0

    @staticmethod
    def _wrap(loader, name: str, loader_type: type, iter_type: type):
        if isinstance(loader, loader_type):
            return iter_type(loader)
        if isinstance(loader, iter_type):
            return loader
        raise InvalidType(
            f"`{name}` has unsupported type: {type(loader)}. Expected types are "
            f"`torch.utils.data.DataLoader` or child of `{iter_type.__name__}`."
        )


class _Update:
    """The finder as :class:`aikit.core.lr_range.Trainer` for one test: its optimizer's groups,
    its ``_train_batch`` on the test's loader, its validation pass."""

    empty_validation = "val_loader yields no samples: give a validation loader with data, or leave val_loader out"

    def __init__(self, finder: LRFinder, train_iter, val_iter, accumulation_steps: int, non_blocking: bool):
        self.finder, self.train_iter, self.val_iter = finder, train_iter, val_iter
        self.accumulation_steps, self.non_blocking = accumulation_steps, non_blocking

    def lrs(self) -> list:
        return [group["lr"] for group in self.finder.optimizer.param_groups]

    def set_lrs(self, lrs: Sequence[float]) -> None:
        for group, lr in zip(self.finder.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr

    def train_update(self) -> float:
        return self.finder._train_batch(self.train_iter, self.accumulation_steps, self.non_blocking)

    def evaluate(self) -> tuple[float, int]:
        with eval_weights([self.finder.optimizer]):  # Schedule-Free: validate its average x, as eval() is for
            return self.finder._validation_totals(self.val_iter, self.non_blocking)

    def val_dataset_size(self) -> int:
        return len(self.val_iter.dataset)


class _Replicas:
    """The ranks of whichever engine aikit detects (torch.distributed, Horovod, XLA), as
    :class:`aikit.core.lr_range.Replicas`: float64 tensors on the finder's device (NCCL and
    XLA reduce only there) through aikit's collectives."""

    def __init__(self, device: torch.device | str):
        self.device = device
        self.size = distributed.world_size()
        self.is_master = distributed.rank() == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        if self.size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        collectives.all_reduce_sum_([tensor])
        return tensor.tolist()

    def broadcast(self, values: Sequence[float]) -> list[float]:
        if self.size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        collectives.broadcast_([tensor], src=0)
        return tensor.tolist()


def _is_ga(optimizer: torch.optim.Optimizer) -> bool:
    """aikit's GA optimizer (the one wrapper that is not a trace optimizer), known without
    importing the GA package: importing the finder loads no layer above it."""
    return isinstance(optimizer, WrappingOptimizer) and not optimizer.follows_trace


def _check_lr_free(optimizer: torch.optim.Optimizer) -> None:
    """A step-size estimator has no LR to test; Schedule-Free's warmup would hide the tested one."""
    kind = lr_free_kind(optimizer)
    if kind == STEP_SIZE_ESTIMATOR:
        raise InvalidType(
            f"{type(optimizer).__name__} estimates its own step size (its lr multiplies the estimate d, 1 by "
            "default), so the range test's LRs would not be the steps it takes: tune its d_coef instead, or "
            "range-test AdamW"
        )
    if kind == SCHEDULE_FREE:
        warming = [g for g in optimizer.param_groups if g.get("k", 0) < g.get("warmup_steps", 0)]
        if warming:
            raise InvalidValue(
                f"{type(optimizer).__name__}'s warmup_steps={warming[0]['warmup_steps']} scales the LR of its first "
                "steps, so the range test's LRs would not be the ones applied: range-test it built with "
                "warmup_steps=0 (and give the warmup to the run)"
            )


def _move(obj, device, non_blocking: bool):
    """``obj`` on ``device``, through tuples, lists and dicts (a module function: a nested
    recursive closure would form a reference cycle that keeps the finder alive)."""
    if hasattr(obj, "to"):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, tuple):
        return tuple(_move(o, device, non_blocking) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device, non_blocking) for o in obj]
    if isinstance(obj, dict):
        return {k: _move(o, device, non_blocking) for k, o in obj.items()}
    return obj


class StateCacher(StateCache):
    """torch-lr-finder's cache of state dicts: deep copies in memory, or ``torch.save`` files in
    ``cache_dir`` (removed with the cache)."""

    suffix = ".pt"

    def _write(self, state_dict: dict, path: str) -> None:
        torch.save(state_dict, path)

    def _read(self, path: str) -> dict:
        return torch.load(path, map_location="cpu")
