"""PyTorch Lightning callbacks: the elastic plan, a batch-size trace and AutoLRS.

Each callback applies what aikit's own PyTorch API computes, through the hooks Lightning
gives, so a ``LightningModule`` trains as the same loop written by hand would:

* :class:`ElasticPlan`: :func:`aikit.elastic.Torch.init`'s plan for the Trainer's devices
  becomes ``trainer.accumulate_grad_batches`` and the module's ``batch_size``;
* :class:`TraceBatchSize`: the global batch follows a trace (a
  :class:`~aikit.elastic.Torch.TraceSampler` feeds the loader, the trace optimizer scales the LR);
* :class:`AutoLRSCallback` (also importable as ``AutoLRS``, its first name): :class:`aikit.autolrs.Torch.AutoLRS`
  after every optimizer step.
"""

from __future__ import annotations

from aikit.optional import lightning  # noqa: F401  isort: skip  (first: a missing lightning names its extra)
from collections.abc import Callable

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr

import aikit.autolrs.Torch
import aikit.elastic.Torch
from aikit.core.errors import InvalidValue
from aikit.core.lr_policy import LRPolicy
from aikit.core.plan import Plan, nearest_even_batches
from aikit.elastic.Torch import TraceOptimizer, TraceSampler
from aikit.runtime.originals import max_device_batch_of

__all__ = ["AutoLRS", "AutoLRSCallback", "ElasticPlan", "TraceBatchSize"]


class ElasticPlan(Callback):
    """Train ``global_batch_size`` samples per update on whatever devices the Trainer has, at
    most ``max_device_batch`` per device (``max_gpu_batch_size=``, Run:AI's AIkit Elastic's name, says the same).

    At ``setup`` the plan for ``trainer.world_size`` devices sets ``trainer.accumulate_grad_batches``
    to its GA steps and the module's ``batch_size_attr`` (an attribute or hparam of the module or
    its datamodule, as Lightning's batch-size finder uses it) to its per-device batch; build the
    train loader from that attribute. Lightning feeds every device the same batch shape, so the
    plan must split evenly; an uneven one is refused with the nearest global batches that do.

    Every update holds exactly ``global_batch_size`` samples when the epoch's batches are a
    multiple of the GA steps and none is short; Lightning weighs every micro-batch loss by
    ``1 / accumulate_grad_batches``, so a short one would be over-weighted. That is checked when
    training starts: use ``drop_last=True`` and a data set that fills whole updates.
    """

    def __init__(self, global_batch_size: int, max_device_batch: int | None = None, batch_size_attr: str = "batch_size",
                 *, max_gpu_batch_size: int | None = None):
        self.global_batch_size = global_batch_size
        self.max_device_batch = max_device_batch_of(max_device_batch, max_gpu_batch_size)
        self.batch_size_attr = batch_size_attr
        self.plan: Plan | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        devices = trainer.world_size
        plan = aikit.elastic.Torch.init(self.global_batch_size, self.max_device_batch, gpus=devices)
        if not plan.is_even or plan.num_replicas != devices:
            below, above = nearest_even_batches(plan.global_batch_size, plan.max_device_batch, devices)
            raise InvalidValue(
                f"global_batch_size {plan.global_batch_size} does not split evenly over {devices} device(s) "
                f"with at most {plan.max_device_batch} samples each, and Lightning gives every device the "
                f"same batch: use global_batch_size {below} or {above}"
            )
        owned = self.plan.micro_steps if self.plan is not None else 1  # a second fit() finds our own value
        if trainer.accumulate_grad_batches not in (1, owned):
            raise InvalidValue(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and ElasticPlan both set "
                "the GA steps: leave accumulate_grad_batches at 1, the plan sets it"
            )
        if not lightning_hasattr(pl_module, self.batch_size_attr):
            raise InvalidValue(
                f"ElasticPlan sets the per-device batch through `{self.batch_size_attr}`, which neither "
                f"{type(pl_module).__name__} nor its hparams or datamodule has: define it and build the train "
                "DataLoader with it"
            )
        trainer.accumulate_grad_batches = plan.micro_steps
        lightning_setattr(pl_module, self.batch_size_attr, plan.device_batch)
        self.plan = plan

    def on_train_start(self, trainer, pl_module) -> None:
        batches, steps = trainer.num_training_batches, self.plan.micro_steps
        if batches != float("inf") and batches % steps:
            raise InvalidValue(
                f"an epoch has {batches} micro-batches per device, not a multiple of the plan's {steps} GA steps: "
                f"the last update would hold fewer than {self.plan.global_batch_size} samples; make the data set "
                f"a multiple of {self.plan.global_batch_size} or drop the rest"
            )
        loader = trainer.train_dataloader
        dataset = getattr(loader, "dataset", None)
        drop_last = getattr(getattr(loader, "batch_sampler", None), "drop_last", True)
        per_update = self.plan.device_batch * trainer.world_size
        if not drop_last and hasattr(dataset, "__len__") and len(dataset) % per_update:
            raise InvalidValue(
                f"the data set's {len(dataset)} samples leave a short last micro-batch, which Lightning would "
                f"weigh as a full one: pass drop_last=True to the DataLoader"
            )


class TraceBatchSize(Callback):
    """The global batch follows ``sampler``'s trace; the LR follows ``rule`` (a rule of
    :data:`aikit.core.scaling.RULES` for a trace: ``"linear"``, ``"sqrt"``, ``"constant"``,
    ``"seesaw"``, ...) against ``ref_batch_size``, the global batch the LR was tuned for, with
    ``warmup_steps`` and an
    ``lr_decay`` over the samples trained (``"seesaw"`` needs one): an
    :class:`~aikit.core.lr_policy.LRPolicy`, checked here.

    Build the train loader with ``DataLoader(dataset, batch_sampler=sampler)``; at
    ``on_fit_start`` the module's one optimizer is wrapped in a
    :class:`~aikit.elastic.Torch.TraceOptimizer` with that policy, which accumulates the
    micro-batches of each trace step and makes one update at the step's scaled LR. Lightning
    then counts micro-batches as its ``global_step`` (``max_steps`` too); the trace optimizer's
    ``updates`` counts updates. One process only: under Lightning's DDP every micro-batch's
    backward all-reduces, while the trace deals replicas different numbers of micro-batches;
    for several processes write the loop with the same sampler and optimizer under torchrun.
    """

    def __init__(self, sampler: TraceSampler, ref_batch_size: int | None = None, rule: str = "linear",
                 *, warmup_steps: int = 0, log_steps: int | None = None,
                 lr_decay: Callable[[int], float] | None = None):
        self.policy = LRPolicy(rule, ref_batch_size, warmup_steps, lr_decay, user="TraceBatchSize")
        if not isinstance(sampler, TraceSampler):
            raise InvalidValue(f"TraceBatchSize needs the TraceSampler that feeds the train loader, got {sampler!r}")
        self.sampler, self.rule, self.ref_batch_size = sampler, self.policy.rule.name, ref_batch_size
        self.log_steps = log_steps
        self.optimizer = None

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.world_size > 1:
            raise InvalidValue(
                f"TraceBatchSize runs in one process, this Trainer has {trainer.world_size}: Lightning's DDP "
                "all-reduces every micro-batch; train several processes with TraceSampler and "
                "TraceOptimizer in a torchrun loop"
            )
        if trainer.accumulate_grad_batches != 1 or trainer.gradient_clip_val:
            raise InvalidValue(
                "TraceBatchSize accumulates each trace step itself: leave Trainer's accumulate_grad_batches "
                "at 1 and gradient_clip_val unset (clip inside the module if needed)"
            )
        if len(trainer.optimizers) != 1:
            raise InvalidValue(f"TraceBatchSize wraps one optimizer, the module configured {len(trainer.optimizers)}")
        inner = trainer.optimizers[0]
        if self.optimizer is None or self.optimizer.optimizer is not inner:
            self.optimizer = TraceOptimizer(inner, self.sampler, policy=self.policy, log_steps=self.log_steps)
        trainer.strategy.optimizers = [self.optimizer]

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # Lightning sets the epoch of a loader's sampler, not of its batch_sampler
        self.sampler.set_epoch(trainer.current_epoch)
        self.optimizer.set_epoch(trainer.current_epoch)


class AutoLRSCallback(Callback):
    """:class:`aikit.autolrs.Torch.AutoLRS` as a callback: ``val_fn()`` returns the validation
    loss; ``min_lr``, ``max_lr`` and the options are AutoLRS's. The same name as the Hugging
    Face callback (:class:`aikit.integrations.huggingface.AutoLRSCallback`); ``AutoLRS``, its
    first name here, still works.

    Created at ``on_train_start`` over the module and its one optimizer (setting the first LR),
    it gets the mean training loss of the micro-batches of every optimizer step, after the
    step, and sets the next LR. An LR scheduler would fight it and is refused.
    """

    def __init__(self, val_fn: Callable[[], float], min_lr: float, max_lr: float, **options):
        self.val_fn, self.min_lr, self.max_lr, self.options = val_fn, min_lr, max_lr, options
        self.autolrs: aikit.autolrs.Torch.AutoLRS | None = None
        self._losses: list[float] = []
        self._steps_seen = 0

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.lr_scheduler_configs:
            raise InvalidValue("AutoLRS sets the learning rate itself: configure no LR scheduler")
        if len(trainer.optimizers) != 1:
            raise InvalidValue(f"AutoLRS drives one optimizer, the module configured {len(trainer.optimizers)}")
        if self.autolrs is None:
            self.autolrs = aikit.autolrs.Torch.AutoLRS(
                pl_module, trainer.optimizers[0], self.val_fn, self.min_lr, self.max_lr, **self.options
            )
        self._steps_seen = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        # Lightning hands back the loss divided by accumulate_grad_batches: undo it
        self._losses.append(float(torch.as_tensor(loss).detach()) * trainer.accumulate_grad_batches)
        if trainer.global_step == self._steps_seen:
            return  # a micro-batch that only accumulated
        self._steps_seen = trainer.global_step
        step_loss = sum(self._losses) / len(self._losses)
        self._losses.clear()
        self.autolrs.on_train_batch_end(step_loss)

    @property
    def lr(self) -> float:
        """The LR the next step uses."""
        return self.autolrs.lr

    def plot(self, path=None):
        """LR and loss over every step (see :meth:`aikit.autolrs.Torch.autolrs.AutoLRS.plot`)."""
        return self.autolrs.plot(path)


AutoLRS = AutoLRSCallback  # the callback's first name, kept for the scripts that import it
