"""The Hugging Face ``Trainer``: ``TrainingArguments`` from the elastic plan, AutoLRS as a callback.

``TrainingArguments(output_dir, **plan_arguments(256, 64))`` trains 256 samples per update on
however many processes torchrun (or ``accelerate launch``) started, at most 64 per device;
``Trainer(..., callbacks=[AutoLRSCallback(val_fn, 1e-3, 1.0)])`` lets AutoLRS set the LR;
``keep_global_batch(trainer)`` keeps the 256 when ``auto_find_batch_size=True`` shrinks the
per-device batch after an out-of-memory error (the Trainer alone keeps its GA steps and
multiplies the batch by 0.9: transformers PR #33281, open).
"""

from __future__ import annotations

from aikit.optional import transformers  # noqa: F401  isort: skip  (first: a missing transformers names its extra)
import copy
import functools
from collections.abc import Callable

import torch
from transformers import Trainer, TrainerCallback

import aikit.autolrs.Torch
import aikit.elastic.Torch
from aikit.core.device_batch import device_batches, smaller_plan
from aikit.core.errors import InvalidState, InvalidType, InvalidValue, TrainingFailed
from aikit.core.plan import make_plan, nearest_even_batches
from aikit.runtime.Torch import memory, random_state

__all__ = ["AutoLRSCallback", "keep_global_batch", "plan_arguments"]


def plan_arguments(global_batch_size: int, max_device_batch: int | None = None, gpus: int | None = None, *,
                   max_gpu_batch_size: int | None = None) -> dict[str, int]:
    """``per_device_train_batch_size`` and ``gradient_accumulation_steps`` for ``TrainingArguments``:
    ``global_batch_size`` samples per update, at most ``max_device_batch`` per device
    (``max_gpu_batch_size=``, Run:AI's AIkit Elastic's name, says the same).

    The plan is :func:`aikit.elastic.Torch.init`'s for the processes of this run (torchrun's
    ``WORLD_SIZE``, or 1) or for ``gpus`` of the GPUs one process finds (at most those). The
    Trainer gives every device the same batch, so an uneven split is refused with the nearest
    global batches that split evenly. Every update holds exactly ``global_batch_size`` samples
    when the data set is a multiple of it and ``dataloader_drop_last=True``: the Trainer divides
    each micro-batch loss by the GA steps, so a short last batch, or an epoch's last update with
    fewer micro-batches, is weighted wrongly.
    """
    plan = aikit.elastic.Torch.init(global_batch_size, max_device_batch, gpus=gpus,
                                    max_gpu_batch_size=max_gpu_batch_size)
    if not plan.is_even or plan.num_replicas != plan.available_gpus:
        below, above = nearest_even_batches(plan.global_batch_size, plan.max_device_batch, plan.available_gpus)
        raise InvalidValue(
            f"global_batch_size {plan.global_batch_size} does not split evenly over {plan.available_gpus} device(s) "
            f"with at most {plan.max_device_batch} samples each, and the Trainer gives every device the same "
            f"batch: use global_batch_size {below} or {above}"
        )
    return {"per_device_train_batch_size": plan.device_batch, "gradient_accumulation_steps": plan.micro_steps}


def keep_global_batch(trainer: Trainer) -> Trainer:
    """``trainer`` (returned) with ``auto_find_batch_size=True`` keeping its global batch: after an
    out-of-memory error the next try runs the next even plan of the same global batch (half the
    per-device batch where that is the next divisor, twice the GA steps), not 0.9 times the batch
    at the same GA steps (a smaller global batch, silently: transformers PR #33281).

    The global batch is the Trainer's own (``per_device_train_batch_size`` x
    ``gradient_accumulation_steps`` x data-parallel processes), as :func:`plan_arguments` set it.
    The Trainer offers no hook between an out-of-memory error and its next try (its
    ``find_executable_batch_size`` passes Accelerate no ``reduce_batch_size_fn``), so this wraps
    the method of *this* trainer that runs a try, ``_inner_training_loop`` (no class or module is
    patched), in a loop of its own: each try runs the plan's per-device batch with
    ``args.gradient_accumulation_steps`` set to its GA steps, after an out-of-memory error as aikit
    tells one (:func:`aikit.runtime.Torch.memory.out_of_memory`: Python's ``MemoryError`` too,
    which Accelerate's matcher lets end the run). A try starts over from the state the ``train()``
    call began with: the model's weights, the optimizer (made again where the Trainer made it,
    else its state put back), a scheduler you gave, the GradScaler and the random streams, so
    updates made before the error are not kept (one copy of the weights is held on the CPU for
    that, while ``train()`` runs). The batch the Trainer proposes starts the search (below it on a
    resume: the checkpoint's batch).
    """
    if not isinstance(trainer, Trainer):
        raise InvalidType(f"keep_global_batch takes a transformers.Trainer, got {type(trainer).__name__}")
    args = trainer.args
    if not args.auto_find_batch_size:
        raise InvalidValue("keep_global_batch steps down the plans of the global batch after an out-of-memory error, "
                           "which the Trainer catches only with TrainingArguments(auto_find_batch_size=True): set it")
    parallel = max(1, args.n_gpu)  # one process's batch is per-device x its DataParallel GPUs
    global_batch = trainer.get_total_train_batch_size(args)
    devices = global_batch // (args.per_device_train_batch_size * args.gradient_accumulation_steps)
    sizes = device_batches(global_batch, devices, "error")
    inner = trainer._inner_training_loop

    @functools.wraps(inner)
    def planned_tries(batch_size=None, *arguments, **options):
        start = max(1, (batch_size or args.train_batch_size) // parallel)  # the Trainer's: the arguments' or a resume's
        plan = make_plan(global_batch, next(s for s in sizes if s <= start), devices, policy="error")
        before = TrainerStart(trainer)
        while True:
            args.per_device_train_batch_size, args.gradient_accumulation_steps = plan.device_batch, plan.micro_steps
            try:
                return inner(plan.device_batch * parallel, *arguments, **options)
            except Exception as error:  # the Trainer's try: out of memory re-plans, any other is raised
                if not memory.out_of_memory(error):
                    raise
                tried, plan = plan.device_batch, smaller_plan(plan)
                if plan is None:
                    raise TrainingFailed(
                        f"out of memory even at {tried} sample per device (global batch {global_batch} on {devices} "
                        "device(s)): the model's step does not fit at all: free memory (gradient checkpointing, "
                        "mixed precision, a smaller model) or shard the model (FSDP, DeepSpeed)"
                    ) from error  # the allocator's words in the cause: in here, Accelerate's matcher would retry them
            memory.free()  # out here: the failed try's frames and tensors are gone
            before.put_back(trainer)

    trainer._inner_training_loop = planned_tries
    return trainer


class TrainerStart:
    """What a ``Trainer.train()`` call began with, to start a try again from it after an
    out-of-memory error: the model's weights (a copy on the CPU), the optimizer (None where the
    Trainer makes it, else its state), a scheduler given to the Trainer, the GradScaler, and the
    random streams."""

    def __init__(self, trainer: Trainer) -> None:
        self.weights = {k: v.detach().to("cpu", copy=True) for k, v in trainer.model.state_dict().items()}
        self.optimizer = None if trainer.optimizer is None else _cpu_copy(trainer.optimizer.state_dict())
        self.scheduler = None if trainer.lr_scheduler is None else _cpu_copy(trainer.lr_scheduler.state_dict())
        scaler = getattr(trainer.accelerator, "scaler", None)
        self.scaler = None if scaler is None else _cpu_copy(scaler.state_dict())
        self.random = random_state.get_state()

    def put_back(self, trainer: Trainer) -> None:
        trainer.model.load_state_dict(self.weights)
        if self.optimizer is None:
            trainer.optimizer = None  # the Trainer makes a fresh one
        else:
            trainer.optimizer.load_state_dict(self.optimizer)
        if self.scheduler is None:
            trainer.lr_scheduler = None
        else:
            trainer.lr_scheduler.load_state_dict(self.scheduler)
        if self.scaler is not None:
            trainer.accelerator.scaler.load_state_dict(self.scaler)
        random_state.set_state(self.random)


def _cpu_copy(state):
    """A deep copy of a ``state_dict``, its tensors on the CPU (a later load puts them back where they go)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: _cpu_copy(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_cpu_copy(value) for value in state)
    return copy.deepcopy(state)


class AutoLRSCallback(TrainerCallback):
    """:class:`aikit.autolrs.Torch.AutoLRS` for the ``Trainer``: ``val_fn()`` returns the
    validation loss; ``min_lr``, ``max_lr`` and the options are AutoLRS's. The same name as the
    Lightning callback (:class:`aikit.integrations.lightning.AutoLRSCallback`).

    Callbacks are not handed the loss, so the callback reads it where the Trainer does: a
    forward hook keeps the ``loss`` the model returns on every training micro-batch, and after
    each optimizer step (``on_step_end``) AutoLRS gets their mean and sets the next LR. The
    model must compute its loss (return ``loss`` first, or as ``"loss"``); evaluation passes
    (no gradient, ``model.eval()``, or inside ``val_fn``) are ignored. AutoLRS sets the LR after the Trainer's LR
    scheduler has stepped, so its LR is the one every step uses; use
    ``lr_scheduler_type="constant"`` so the logged LR is not misleading.
    """

    def __init__(self, val_fn: Callable[[], float], min_lr: float, max_lr: float, **options):
        self.val_fn, self.min_lr, self.max_lr, self.options = val_fn, min_lr, max_lr, options
        self.autolrs: aikit.autolrs.Torch.AutoLRS | None = None
        self._losses: list[float] = []
        self._hook = None
        self._deciding = False  # True while AutoLRS decides (and val_fn may run the model)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.autolrs is None:
            self.autolrs = aikit.autolrs.Torch.AutoLRS(
                model, optimizer, self.val_fn, self.min_lr, self.max_lr, **self.options
            )
        self._losses.clear()
        self._hook = model.register_forward_hook(self._keep_loss)

    def _keep_loss(self, module, inputs, output) -> None:
        if self._deciding or not (module.training and torch.is_grad_enabled()):
            return  # val_fn's passes, or evaluation
        loss = output["loss"] if isinstance(output, dict) else output[0] if isinstance(output, tuple) else None
        if loss is None:
            raise InvalidValue(
                f"AutoLRSCallback reads the loss the model returns, but {type(module).__name__} returned "
                f"{type(output).__name__} without one: return the loss first or as 'loss'"
            )
        self._losses.append(float(loss.detach()))

    def on_step_end(self, args, state, control, **kwargs):
        if not self._losses:
            raise InvalidState("AutoLRSCallback saw no training loss in this step: did the model compute one?")
        step_loss = sum(self._losses) / len(self._losses)
        self._losses.clear()
        self._deciding = True
        try:
            self.autolrs.on_train_batch_end(step_loss)
        finally:
            self._deciding = False

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    @property
    def lr(self) -> float:
        """The LR the next step uses."""
        return self.autolrs.lr
