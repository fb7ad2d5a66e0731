"""Keras on torch: eager, one process, one device; no device read where a graph would have none.

Keras 3.15's torch trainer runs each step eagerly on one device (no ``DistributedDataParallel``,
no ``keras.distribution`` for torch), and its ``ops.cond`` is a Python ``if`` on the predicate:
on a device tensor, a host read (a sync on a GPU) every micro-step. Here the GA window's position
is known on the host (:func:`host_value`: a variable's value read once and then followed through
its tensor's version counter, so read again only after something else assigned it: a load, a
reset); whether the update is finite is the one number read per update (:func:`cond`).
"""

from __future__ import annotations

import contextlib
import os

import keras
import numpy as np
import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.runtime.Keras import sums
from aikit.runtime.Keras.batches import ArrayBatches
from aikit.runtime.Torch.grads import scale_and_check_

ops = keras.ops
INT_MAX = 2**63 - 1
PER_REPLICA_DECLARATION = False  # a loss hands its weight to apply() in the same eager step
UPDATE_ALL_REDUCES = False  # one device: no all-reduce
STRATEGIES = None
HOROVOD = False


def replicas() -> int:
    return 1


def replicas_sum(value):
    return value


def host_value(variable) -> int:
    """``variable``'s integer value, read from the device only when it changed outside :func:`assign_known`
    (the value the host knows is kept on the variable, with the tensor version it was known at)."""
    tensor = variable.value
    known = getattr(variable, "_aikit_known", None)
    if known is None or known[0] is not tensor or known[1] != tensor._version:
        known = (tensor, tensor._version, int(tensor))
        variable._aikit_known = known
    return known[2]


def assign_known(variable, value: int) -> None:
    """Assign an integer the host knows, so that :func:`host_value` need not read it back."""
    variable.assign(value)
    variable._aikit_known = (variable.value, variable.value._version, value)


def cond(pred, true_fn, false_fn, variables):
    """A Python ``if``: on a host bool (the window's end, no read), or on a device value (is the
    update finite?) read once per update, as aikit's torch GA engine and Keras' ``LossScaleOptimizer``
    on torch decide it: keeping one of both branches by ``where`` instead copies every variable four
    times an update (2.0x Keras' own GA's time in benchmarks/ga_keras.py, against 1.0x with the read)."""
    return true_fn() if bool(pred) else false_fn()


def window_ends(accumulated, micro_steps) -> bool:
    """Whether this micro-step ends the update, decided on the host (no read per micro-step)."""
    return host_value(accumulated) + 1 >= host_value(micro_steps)


def advance(accumulated, is_update: bool) -> None:
    assign_known(accumulated, 0 if is_update else host_value(accumulated) + 1)


def computes_float64() -> bool:
    """Whether a float64 variable computes in float64: always on torch."""
    return True


def eager(value) -> bool:
    return not torch.compiler.is_compiling()


# --- the GA sums, in place: one grouped kernel each, where keras.ops would allocate a tensor per
# variable and copy it back (on a CPU a fresh allocation of a large tensor faults its pages in) ---

def add_to(optimizer, totals: list, values: list) -> None:
    """Add each of ``values`` to its total, in place."""
    if totals:
        torch._foreach_add_([total.value for total in totals], list(values))


def divided(totals: list, divisor) -> list:
    """The totals over ``divisor``, divided in place: the update's gradients are the totals'
    own tensors (cleared after the update)."""
    tensors = [total.value for total in totals]
    if tensors and not (isinstance(divisor, int) and divisor == 1):
        torch._foreach_div_(tensors, divisor)
    return tensors


def clear(totals: list) -> None:
    if totals:
        torch._foreach_zero_([total.value for total in totals])


def nonfinite(totals: list):
    """Nonzero when any of ``totals`` holds an inf or NaN: AMP's check kernel, one pass over them
    without the allocation of ``isfinite`` (times 1, exact); float64 totals are counted as on
    the other backends."""
    flag = scale_and_check_([total.value.detach() for total in totals], 1.0) if totals else None  # (Tensors)
    return sums.nonfinite(totals) if flag is None else flag


def check_apply_context(built: bool) -> None:
    """Nothing to refuse: a torch step has no replica context."""


def merged_update(optimizer, sums, variables) -> bool:
    return False


def read_variable(variable):
    return keras.ops.convert_to_numpy(variable.value)


# --- distribution: one device (aikit.keras.elastic) ---

ONE_DEVICE = ("Keras 3.15's torch trainer, one device: it has no DistributedDataParallel and no keras.distribution; "
              "for data parallel run Keras with KERAS_BACKEND=jax (keras.distribution) or tensorflow "
              "(tf.distribute), or train the torch model with aikit.elastic.Torch under torchrun")


def found_devices(strategy) -> tuple[int, str, int, dict]:
    """One device: the one Keras' torch backend trains on."""
    if strategy is not None:
        raise InvalidType(f"strategy={strategy!r:.60} is tf.distribute's (Keras on TensorFlow); Keras on torch "
                          "trains on one device: leave strategy out")
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1 or (torch.distributed.is_available() and torch.distributed.is_initialized()
                     and torch.distributed.get_world_size() > 1):
        raise InvalidValue(f"this process is one of {world} a launcher started, but aikit's Keras adapter on "
                           f"torch trains in one process: {ONE_DEVICE}")
    return 1, ONE_DEVICE, 0, {}


def distribute(found: dict, devices: int, global_batch: int) -> dict:
    return {}


def describe(published: dict) -> str:
    return "one device (Keras on torch)"


def placement(strategy, published: dict):
    if strategy is not None:
        found_devices(strategy)  # refused, by name
    return None


def scope(placement):
    return contextlib.nullcontext()


def placed(model, placement):
    return model


def fresh_optimizer(optimizer, placement):
    return optimizer


def check_placed(keras_model, user: str) -> None:
    """Nothing to refuse: one device."""


def model_replicas(keras_model) -> int:
    return 1


def feeding_devices(plan) -> int:
    return 1


def check_batches(keras_model, samples: int, step_batch: int) -> None:
    """Nothing to refuse: one device takes any batch."""


def train_micro_step(keras_model, x, y, rows) -> float:
    (mine,) = rows
    return float(np.ravel(keras_model.train_on_batch(x[mine], y[mine]))[0])


def parts_per_micro_step(keras_model) -> int:
    return 1


def chief_decides(keras_model, decide, size: int) -> list[float]:
    """One process: its own decision."""
    return list(decide())


# --- the LR finder's own loop: data, functions, gradients ---

def batches(data, name: str, batch_size: int, shuffle: bool, repeat: bool = False):
    return ArrayBatches(data, name, batch_size, shuffle, repeat)


def compiled(function):
    return function


def gradient_function(model, loss_of):
    """The gradients by torch's autograd."""

    def gradients(x, y, sample_weight, divisor, scale_loss):
        variables = model.trainable_variables
        for variable in variables:
            variable.value.grad = None
        loss = loss_of(x, y, sample_weight, True) / divisor
        scale_loss(loss).backward()
        grads = [variable.value.grad for variable in variables]
        with torch.no_grad():
            return grads, loss.detach()

    return gradients


def model_scope(model):
    return contextlib.nullcontext()
