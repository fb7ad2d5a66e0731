"""Keras on TensorFlow: ``tf.distribute``'s replicas, and the GA update taken across them.

Each replica of a ``tf.distribute`` strategy hands ``apply`` its own gradients (its loss divided
by the replicas) and Keras' optimizer sums them in its one all-reduce; the GA update's ``tf.cond``
is taken in cross-replica context inside one ``merge_call`` and re-enters the replicas from there
(the pattern of Keras' ``LossScaleOptimizer``: a ``merge_call`` inside a replica-side ``tf.cond``
is what breaks the usual GA recipes). Stateful branches are fine in a TensorFlow graph.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from aikit.core.errors import InvalidType, InvalidValue
from aikit.runtime.Keras import strategies
from aikit.runtime.Keras.batches import check_lengths
from aikit.runtime.Keras.sums import add_to, clear, divided, nonfinite  # noqa: F401  (the GA sums' arithmetic)

ops = keras.ops
INT_MAX = 2**63 - 1  # what an int64 variable holds
PER_REPLICA_DECLARATION = True  # a loss declares its weight into an ON_READ variable, per replica
UPDATE_ALL_REDUCES = True  # Keras' optimizer sums the replicas' gradients in its update
STRATEGIES = strategies
HOROVOD = True  # horovod.tensorflow's ops


def replicas() -> int:
    return tf.distribute.get_strategy().num_replicas_in_sync


def replicas_sum(value):
    context = tf.distribute.get_replica_context()
    if context is None or replicas() == 1:
        return value
    return context.all_reduce("sum", value)


def cond(pred, true_fn, false_fn, variables):
    """``tf.cond``: its branches may assign variables (``variables`` is for the other backends)."""
    return ops.cond(pred, true_fn, false_fn)


def window_ends(accumulated, micro_steps):
    return accumulated + 1 >= micro_steps


def advance(accumulated, is_update) -> None:
    accumulated.assign(ops.where(is_update, 0, accumulated + 1))


def computes_float64() -> bool:
    """Whether a float64 variable computes in float64: always on TensorFlow."""
    return True


def eager(value) -> bool:
    """Whether ``apply`` runs eagerly on one replica (where Python may read, warn and raise)."""
    return tf.executing_eagerly() and replicas() == 1


def check_apply_context(built: bool) -> None:
    """Refuse what ``tf.distribute`` cannot run: a first build while tracing the replica function
    (its variables would break the update's ``tf.cond``), an ``apply`` in cross-replica context."""
    if not built and (tf.inside_function() and tf.distribute.has_strategy()
                      and not tf.__internal__.distribute.strategy_supports_no_merge_call()):
        raise InvalidValue(
            "build the GA optimizer before tracing under a tf.distribute strategy: call "
            "optimizer.build(model.trainable_variables) inside strategy.scope() first "
            "(Model.fit does this itself)"
        )
    if tf.distribute.in_cross_replica_context():
        raise InvalidValue("apply() must run in a replica context: call it inside strategy.run(...) or Model.fit")


def merged_update(optimizer, sums, variables) -> bool:
    """Under a multi-replica strategy, the GA update of ``optimizer`` taken in cross-replica
    context, inside one ``merge_call``: the replicas' non-finite counts reduced to one number,
    then each replica's update or skip. False (nothing done) on one replica."""
    if tf.__internal__.distribute.strategy_supports_no_merge_call():
        return False

    def cross_replica(strategy):
        each = strategy.extended.call_for_each_replica
        optimizer._maybe_update(lambda: optimizer._update_if_finite(
            lambda: strategy.reduce("SUM", each(optimizer._nonfinite_count, args=(sums,)), axis=None),
            lambda: each(optimizer._update, args=(sums, variables)), lambda: each(optimizer._skip, args=(sums,))))

    tf.distribute.get_replica_context().merge_call(cross_replica)
    return True


def read_variable(variable):
    return variable.numpy()  # (its .value is its tf.Variable, which numpy() reads, on every replica)


# --- distribution: what an elastic plan runs on (aikit.keras.elastic) ---

def check_strategy(strategy) -> None:
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise InvalidType(
            f"strategy must be a tf.distribute.Strategy object, got {strategy!r:.60}: pass e.g. "
            "tf.distribute.MirroredStrategy(), or leave strategy out to use every device found"
        )


def found_devices(strategy) -> tuple[int, str, int, dict]:
    """The devices a plan may use: (how many, what holds them, this worker's rank, the state
    :func:`distribute` narrows). Horovod's processes when the program initialised it, else the
    replicas of ``strategy`` or of the strategy found (:mod:`aikit.runtime.Keras.strategies`)."""
    check_strategy(strategy)
    hvd = strategies.horovod()
    launched = strategies.horovodrun_processes()
    if hvd is None and launched > 1:
        raise InvalidValue(
            f"this process is one of {launched} that horovodrun started, but horovod.tensorflow is not "
            "initialised, so each would train alone: call `import horovod.tensorflow as hvd; hvd.init()` "
            "before init() and compile with aikit.keras.elastic.horovod.DistributedOptimizer (Run:AI's AIkit "
            "initialised Horovod itself), or run the script once with python: aikit then uses every GPU of "
            "the machine through MirroredStrategy"
        )
    chosen = strategy or strategies.available_strategy()
    if hvd is not None:
        return hvd.size(), "Horovod", hvd.rank(), {"strategy": chosen, "hvd": hvd}
    return chosen.num_replicas_in_sync, type(chosen).__name__, strategies.rank(chosen), {"strategy": chosen}


def distribute(found: dict, devices: int, global_batch: int) -> dict:
    """What ``init`` publishes beside its plan of ``devices``: the strategy narrowed to them (and
    Horovod's module under Horovod, whose every process must train)."""
    hvd = found.get("hvd")
    if hvd is None:
        return {"strategy": strategies.mirrored_on(found["strategy"], devices)}
    if devices != hvd.size():
        raise InvalidValue(
            f"the plan uses {devices} of the {hvd.size()} Horovod processes (global_batch_size {global_batch}), "
            f"but every process must train: launch {devices} process(es), or use a global batch "
            f"that splits evenly over {hvd.size()}"
        )
    return found


def describe(published: dict) -> str:
    return f"strategy: {type(published['strategy']).__name__}"


def placement(strategy, published: dict):
    check_strategy(strategy)
    return strategy or published.get("strategy") or tf.distribute.get_strategy()


def scope(placement):
    return placement.scope()


def created_in(model, strategy) -> bool:
    """True when every variable of ``model`` lives under ``strategy`` (or none exists yet)."""
    return all(strategy.extended.variable_created_in_scope(w.value) for w in model.weights)


def placed(model, placement):
    if created_in(model, placement):
        return model
    try:
        with placement.scope():
            copy = keras.models.clone_model(model)
            copy.set_weights(model.get_weights())
    except Exception as error:
        raise InvalidValue(
            f"the model's variables were created outside the plan's {type(placement).__name__} and "
            f"it cannot be cloned into it ({error}): build the model inside "
            "`with aikit.keras.elastic.strategy.scope():`"
        ) from error
    return copy


def fresh_optimizer(optimizer, placement):
    if not optimizer.built and not placement.extended.variable_created_in_scope(optimizer.iterations.value):
        return optimizer.from_config(optimizer.get_config())
    return optimizer


def model_replicas(keras_model) -> int:
    return keras_model.distribute_strategy.num_replicas_in_sync


def feeding_devices(plan) -> int:
    """The devices this process feeds a micro-batch each per micro-step (one process feeds them all)."""
    return plan.num_replicas


def check_batches(keras_model, samples: int, step_batch: int) -> None:
    """Nothing to refuse: a strategy splits a short last batch over its replicas."""


def train_micro_step(keras_model, x, y, rows) -> float:
    """One micro-step in which replica ``r`` trains on samples ``rows[r]``; returns the loss.

    Each replica is handed its own rows as distributed values: ``train_on_batch`` given plain
    arrays would hand every replica the whole batch (each then computing the same gradient)."""
    if len(rows) == 1:
        return float(np.ravel(keras_model.train_on_batch(x[rows[0]], y[rows[0]]))[0])
    strategy = keras_model.distribute_strategy
    # what train_on_batch does first, from one replica's arrays: Keras' symbolic build of the
    # compiled loss and metrics needs shapes, which distributed values do not have
    keras_model._maybe_symbolic_build(data_batch=(x[rows[0]], y[rows[0]], None))

    def distributed(array):
        parts = [array[r] for r in rows]
        return strategy.experimental_distribute_values_from_function(
            lambda context: parts[context.replica_id_in_sync_group])

    return float(np.ravel(keras_model.train_on_batch(distributed(x), distributed(y)))[0])


def check_placed(keras_model, user: str) -> None:
    """Nothing to refuse here: a strategy's variables are checked where they are placed."""


def parts_per_micro_step(keras_model) -> int:
    return model_replicas(keras_model)


def chief_decides(keras_model, decide, size: int) -> list[float]:
    """``decide()``'s numbers from the chief (worker 0) on every worker of ``keras_model``'s
    strategy: one sum over the replicas, to which only global replica 0 contributes (exact)."""
    strategy = getattr(keras_model, "distribute_strategy", None)
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return list(decide())
    packed = np.zeros(size, dtype=np.float64)
    if strategies.rank(strategy) == 0:
        packed[:] = decide()
    chief = tf.constant(packed)

    def contribution():
        first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
        return chief * tf.cast(first, tf.float64)

    agreed = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(contribution), axis=None)
    return agreed.numpy().tolist()


# --- the LR finder's own loop: data, compiled functions, gradients ---

def batches(data, name: str, batch_size: int, shuffle: bool, repeat: bool = False):
    """``data`` as a ``tf.data.Dataset`` of batches (a dataset given is used as it is)."""
    if isinstance(data, tf.data.Dataset):
        return data.repeat() if repeat else data
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        check_lengths(data, name)
        dataset = tf.data.Dataset.from_tensor_slices(tuple(data))
        if shuffle:
            dataset = dataset.shuffle(len(data[0]), reshuffle_each_iteration=True)
        dataset = dataset.batch(batch_size)
        return dataset.repeat() if repeat else dataset
    raise InvalidType(
        f"`{name}` has unsupported type: {type(data)}. Expected a tf.data.Dataset of (x, y) "
        "batches or a tuple (x, y) of arrays."
    )


def compiled(function):
    """``function`` as a graph (``tf.function``, shape-generic after two shapes)."""
    return tf.function(function, reduce_retracing=True)


def gradient_function(model, loss_of):
    """The gradients through ``tf.GradientTape``, compiled."""

    def gradients(x, y, sample_weight, divisor, scale_loss):
        with tf.GradientTape() as tape:
            loss = loss_of(x, y, sample_weight, True) / divisor
            scaled = scale_loss(loss)
        return tape.gradient(scaled, model.trainable_variables), loss

    return compiled(gradients)


def model_scope(model):
    return model.distribute_strategy.scope()
