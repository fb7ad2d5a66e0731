"""Keras on JAX: a step is one pure, jitted function, and the mesh's devices are one replica.

Keras' JAX trainer calls ``optimizer.stateless_apply`` inside its jitted ``train_step``, with
every variable's value passed in and returned: a state change that is not a variable the
optimizer tracks is lost, and a ``jax.lax.cond`` branch cannot assign a variable (its values would
leak out of the branch). So :func:`cond` runs each branch as a pure function of the tracked
variables' values, in a ``keras.StatelessScope`` of its own, and assigns what the taken branch
returns, the pattern of Keras' ``LossScaleOptimizer``: only the taken branch runs (a micro-step
adds gradients and nothing else). Under ``keras.distribution.DataParallel`` XLA reduces each
micro-step's gradient over the mesh inside the step (GSPMD), so the optimizer sees one replica.
"""

from __future__ import annotations

import contextlib

import jax
import keras
import numpy as np

from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.runtime.Keras.batches import ArrayBatches
from aikit.runtime.Keras.sums import add_to, clear, divided, nonfinite  # noqa: F401  (the GA sums' arithmetic)
from aikit.runtime.process import distribution_set_by_aikit, remember_distribution

ops = keras.ops
INT_MAX = 2**63 - 1 if jax.config.jax_enable_x64 else 2**31 - 1  # without x64 an int64 variable is int32
PER_REPLICA_DECLARATION = False  # a loss hands its weight to apply() inside the same traced step
UPDATE_ALL_REDUCES = False  # XLA reduces each micro-step's gradient over the mesh
STRATEGIES = None
HOROVOD = False


def replicas() -> int:
    return 1


def replicas_sum(value):
    return value


def cond(pred, true_fn, false_fn, variables):
    """``jax.lax.cond`` over branches that assign ``variables``: each runs as a pure function of
    their values (its own ``StatelessScope``), the taken one's values are assigned, and its result
    returned."""
    values = [v.value for v in variables]

    def pure(branch):
        def run():
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))) as scope:
                result = branch()
            return [scope.get_current_value(v) for v in variables], result

        return run

    new, result = ops.cond(pred, pure(true_fn), pure(false_fn))
    for variable, value in zip(variables, new, strict=True):
        variable.assign(value)
    return result


def window_ends(accumulated, micro_steps):
    """Whether this micro-step ends the update: a traced value (the step is compiled once)."""
    return accumulated + 1 >= micro_steps


def advance(accumulated, is_update) -> None:
    accumulated.assign(ops.where(is_update, 0, accumulated + 1))


def computes_float64() -> bool:
    """Whether a float64 variable computes in float64: only with ``jax_enable_x64`` (without it JAX
    makes a float64 array float32, and a Keras variable of dtype float64 holds one)."""
    return bool(jax.config.jax_enable_x64)


def eager(value) -> bool:
    """Whether ``value`` is concrete: ``apply`` runs outside a trace (where Python may warn and raise)."""
    return not isinstance(value, jax.core.Tracer)


def check_apply_context(built: bool) -> None:
    """Nothing to refuse: a JAX step has no replica context."""


def merged_update(optimizer, sums, variables) -> bool:
    return False


def read_variable(variable):
    return keras.ops.convert_to_numpy(variable.value)


# --- distribution: keras.distribution over JAX's devices and processes (aikit.keras.elastic) ---



def _no_strategy(strategy) -> None:
    if strategy is not None:
        raise InvalidType(
            f"strategy={strategy!r:.60} is tf.distribute's (Keras on TensorFlow); on JAX aikit plans over "
            "keras.distribution: leave strategy out (init sets DataParallel over the plan's devices), or set your "
            "own with keras.distribution.set_distribution before init"
        )


def _devices_of(distribution) -> int:
    return int(distribution.device_mesh.devices.size)


def _users(distribution):
    return None if distribution is None or distribution is distribution_set_by_aikit() else distribution


def found_devices(strategy) -> tuple[int, str, int, dict]:
    """JAX's devices over all processes (``keras.distribution.initialize`` joins them), or those of
    the distribution the program set; this process's index is the plan's rank."""
    _no_strategy(strategy)
    current = _users(keras.distribution.distribution())
    count = len(keras.distribution.list_devices()) if current is None else _devices_of(current)
    where = f"JAX, {jax.device_count()} device(s) in {jax.process_count()} process(es)"
    return count, where, jax.process_index(), {"distribution": current}


def distribute(found: dict, devices: int, global_batch: int) -> dict:
    """The distribution the plan trains under: the program's, or ``DataParallel`` over the plan's
    ``devices`` (set as Keras' distribution: models built after ``init`` are laid out on it)."""
    current = found["distribution"]
    if current is not None:
        if _devices_of(current) != devices:
            raise InvalidValue(
                f"the plan uses {devices} device(s) but the keras.distribution set has {_devices_of(current)} "
                f"(global_batch_size {global_batch}): set one over {devices}, a global batch that splits over "
                f"{_devices_of(current)}, or none (init then sets DataParallel over the plan's devices)"
            )
        return {"distribution": current}
    if devices < jax.device_count() and jax.process_count() > 1:
        raise InvalidValue(
            f"the plan uses {devices} of the {jax.device_count()} devices of {jax.process_count()} JAX processes "
            f"(global_batch_size {global_batch}), but every process must train: use a global batch that splits "
            f"evenly over {jax.device_count()}, or start fewer processes"
        )
    chosen = None
    if devices > 1 or jax.process_count() > 1:
        # over several processes each feeds its own share (the plan's), as Horovod's ranks do: no auto-sharding
        chosen = keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:devices],
                                                 auto_shard_dataset=jax.process_count() == 1)
    remember_distribution(chosen)
    keras.distribution.set_distribution(chosen)
    return {"distribution": chosen}


def describe(published: dict) -> str:
    chosen = published["distribution"]
    return "one device" if chosen is None else f"{type(chosen).__name__} over {_devices_of(chosen)} device(s)"


def placement(strategy, published: dict):
    _no_strategy(strategy)
    return published.get("distribution") or keras.distribution.distribution()


def scope(placement):
    return contextlib.nullcontext() if placement is None else placement.scope()


def _local_variables(variables) -> list:
    return [v for v in variables if isinstance(getattr(v.value, "sharding", None), jax.sharding.SingleDeviceSharding)]


def placed(model, placement):
    """``model``, or a copy with the same weights laid out on the distribution ``placement``'s mesh:
    variables made before the distribution was set sit on one device, and ``jax.jit`` refuses the mix."""
    if placement is None or _devices_of(placement) == 1 or not _local_variables(model.weights):
        return model
    with placement.scope():
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
    return copy


def fresh_optimizer(optimizer, placement):
    if placement is not None and not optimizer.built and _local_variables(optimizer.variables):
        return optimizer.from_config(optimizer.get_config())
    return optimizer


def check_placed(keras_model, user: str) -> None:
    """Refuse a model or optimizer with variables on one device under a multi-device distribution:
    what ``jax.jit`` would refuse as "incompatible devices", with the fix."""
    distribution = keras.distribution.distribution()
    if distribution is None or _devices_of(distribution) == 1:
        return
    optimizer = getattr(keras_model, "optimizer", None)
    local = _local_variables([*keras_model.weights, *(optimizer.variables if optimizer is not None else [])])
    if local:
        raise InvalidState(
            f"{user}: variable {local[0].path!r} was made before keras.distribution's "
            f"{type(distribution).__name__} was set, so it sits on one device while the others are laid out on "
            f"{_devices_of(distribution)} (jax.jit refuses that: 'incompatible devices'): build the model and its "
            "optimizer after aikit.keras.elastic.init (or keras.distribution.set_distribution), or wrap it in "
            "aikit.keras.elastic.Model, which moves it onto the mesh"
        )


def model_replicas(keras_model) -> int:
    """The devices a step's batch is split over: the distribution's (one without one)."""
    distribution = keras.distribution.distribution()
    return 1 if distribution is None else _devices_of(distribution)


def feeding_devices(plan) -> int:
    """The devices this process feeds per micro-step: its own share of the mesh."""
    return plan.num_replicas // jax.process_count()


def check_batches(keras_model, samples: int, step_batch: int) -> None:
    """Refuse data whose last batch cannot be split over the mesh (keras#21167: Keras on JAX cannot)."""
    devices = model_replicas(keras_model) // jax.process_count()
    left = samples % step_batch
    if devices > 1 and left % devices:
        raise InvalidValue(
            f"{samples} samples leave a last batch of {left}, which does not split over the {devices} devices of "
            f"this process (Keras on JAX shards every batch over them, keras#21167): train on the first "
            f"{samples - left} samples, or on a number of samples whose remainder by {step_batch} is a multiple "
            f"of {devices}"
        )


def train_micro_step(keras_model, x, y, rows) -> float:
    """One micro-step in which replica ``r`` trains on samples ``rows[r]``: this process feeds its
    devices' rows, in device order, and Keras shards the batch over them."""
    local = len(rows) // jax.process_count()
    mine = np.concatenate(rows[jax.process_index() * local:(jax.process_index() + 1) * local])
    return float(np.ravel(keras_model.train_on_batch(x[mine], y[mine]))[0])


def parts_per_micro_step(keras_model) -> int:
    """Gradients a micro-step hands the optimizer apart: one, reduced over the mesh by XLA."""
    return 1


def chief_decides(keras_model, decide, size: int) -> list[float]:
    """``decide()``'s numbers from process 0 on every process (one broadcast); alone, its own."""
    if jax.process_count() == 1:
        return list(decide())
    from jax.experimental import multihost_utils

    packed = np.zeros(size, dtype=np.float64)
    if jax.process_index() == 0:
        packed[:] = decide()
    return np.asarray(multihost_utils.broadcast_one_to_all(packed)).tolist()


# --- the LR finder's own loop: data, functions, gradients ---

def batches(data, name: str, batch_size: int, shuffle: bool, repeat: bool = False):
    return ArrayBatches(data, name, batch_size, shuffle, repeat)


def compiled(function):
    return function


def gradient_function(model, loss_of):
    """``jax.value_and_grad`` of the loss as a pure function of the variables' values (a ``StatelessScope``)."""

    def gradients(x, y, sample_weight, divisor, scale_loss):
        variables = model.trainable_variables

        def scaled_loss(values):
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                loss = loss_of(x, y, sample_weight, True) / divisor
                return scale_loss(loss), loss

        (_, loss), grads = jax.value_and_grad(scaled_loss, has_aux=True)([v.value for v in variables])
        return grads, loss

    return gradients


def model_scope(model):
    return scope(keras.distribution.distribution())
