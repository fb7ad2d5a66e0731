"""Run the MirroredStrategy checks over two logical CPU devices and print them as JSON.

A separate process because the logical devices must be configured before TensorFlow
initialises its devices; test_mirrored.py runs it once and asserts on what it prints.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from two_cpus import DEVICES, calls, strategy, tf

# isort: split
from tf_common import data, gradients, keras, max_difference, mlp

import aikit.elastic.TF as elastic_tf
from aikit.core.scaling import scaled_lr
from aikit.core.schedule import Schedule
from aikit.ga.TF.optimizers import Optimizer

keras.config.set_floatx("float64")


def big_batch_reference(x, y, batch: int, epochs: int, make_optimizer) -> keras.Model:
    reference = mlp()
    reference.compile(make_optimizer(), loss="mse")
    reference.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return reference


def adam():
    return keras.optimizers.Adam(0.01, weight_decay=0.05)


results: dict = {}
x, y = data(48)

# init inside a user's scope plans over its replicas; Model.fit equals the big-batch fit
with strategy.scope():
    plan = elastic_tf.init(24, 4, verbose=False)
results["plan"] = [plan.steps, plan.batch_size, plan.gpus, plan.global_batch_size]
results["init_uses_the_scope"] = elastic_tf.strategy is strategy
model = elastic_tf.model.Model(mlp())  # built outside the scope: moved into it
model.compile(adam(), loss="mse")
model.fit(x, y, batch_size=elastic_tf.batch_size, epochs=2, shuffle=False, verbose=0)
results["fit_difference"] = max_difference(model, big_batch_reference(x, y, 24, 2, adam))
results["fit_updates"] = int(model.optimizer.iterations.numpy())
results["fit_micro_steps"] = int(model.optimizer.micro_steps.numpy())
results["graph_reductions_traced"] = len(calls)  # one all-reduce in the traced graph, in the update branch

# executed reductions, counted eagerly: GA (3 micro-steps an update) against Keras without GA
for name, steps in (("eager_reductions_ga", 3), ("eager_reductions_plain", 1)):
    calls.clear()
    with strategy.scope():
        eager = mlp()
        optimizer = Optimizer(adam(), steps) if steps > 1 else adam()
        eager.compile(optimizer, loss="mse", run_eagerly=True)
    eager.fit(x[:24], y[:24], batch_size=8, epochs=1, shuffle=False, verbose=0)  # 3 micro-steps
    results[name] = len(calls)
    results[name + "_updates"] = int(eager.optimizer.iterations.numpy())

# the optimizer alone in a custom loop: strategy.run + apply, per-replica slices
with strategy.scope():
    custom = mlp()
    ga = Optimizer(keras.optimizers.SGD(0.1, momentum=0.9), 2)
    ga.build(custom.trainable_variables)  # before tracing, as Keras' fit does
micro, replicas = 3, 2


@tf.function
def micro_step(xb, yb):
    def replica_step(xr, yr):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(custom(xr) - yr), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=micro * replicas)
        ga.apply(tape.gradient(loss, custom.trainable_variables), custom.trainable_variables)

    strategy.run(replica_step, args=(xb, yb))


def per_replica(values):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(values[context.replica_id_in_sync_group]))


for m in range(4):  # 4 micro-steps of 2 x 3 samples: two updates of 12
    rows = [slice(m * 6 + r * micro, m * 6 + (r + 1) * micro) for r in range(replicas)]
    micro_step(per_replica([x[s] for s in rows]), per_replica([y[s] for s in rows]))
reference, sgd = mlp(), keras.optimizers.SGD(0.1, momentum=0.9)
for u in range(2):
    sgd.apply(gradients(reference, x[u * 12:(u + 1) * 12], y[u * 12:(u + 1) * 12]), reference.trainable_variables)
results["custom_loop_difference"] = max_difference(custom, reference)
results["custom_loop_updates"] = int(ga.iterations.numpy())

# a NaN in one replica's micro-batch: the replicas' non-finite counts are summed in the update, so
# both replicas skip it (no weight, no iteration moves) and the next update trains as usual
with strategy.scope():
    poisoned = mlp()
    skipping = Optimizer(keras.optimizers.SGD(0.1, momentum=0.9), 2)
    skipping.build(poisoned.trainable_variables)
calls.clear()


@tf.function
def poisoned_step(xb, yb):
    def replica_step(xr, yr):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(poisoned(xr) - yr), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=micro * replicas)
        skipping.apply(tape.gradient(loss, poisoned.trainable_variables), poisoned.trainable_variables)

    strategy.run(replica_step, args=(xb, yb))


for m in range(4):  # the first update's second micro-step has a NaN target on replica 1 only
    rows = [slice(m * 6 + r * micro, m * 6 + (r + 1) * micro) for r in range(replicas)]
    targets = [y[s].copy() for s in rows]
    if m == 1:
        targets[1][0, 0] = float("nan")
    poisoned_step(per_replica([x[s] for s in rows]), per_replica(targets))
results["skip_graph_reductions_traced"] = len(calls)  # the gradients' all-reduce: still one (batch_reduce_to)
reference, sgd = mlp(), keras.optimizers.SGD(0.1, momentum=0.9)
sgd.apply(gradients(reference, x[12:24], y[12:24]), reference.trainable_variables)
results["skip_difference"] = max_difference(poisoned, reference)
results["skip_counts"] = [skipping.skipped, skipping.skipped_in_a_row, int(skipping.iterations.numpy())]

# an optimizer first built while tracing a replica function is refused with the fix
with strategy.scope():
    unbuilt = Optimizer(keras.optimizers.SGD(0.1), 2)


@tf.function
def unbuilt_step(xb):
    def replica_step(xr):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(custom(xr))
        unbuilt.apply(tape.gradient(loss, custom.trainable_variables), custom.trainable_variables)

    strategy.run(replica_step, args=(xb,))


try:
    unbuilt_step(tf.ones((4, 4), dtype="float64"))
    results["unbuilt_error"] = None
except ValueError as error:
    results["unbuilt_error"] = str(error)

# a batch-size trace over both replicas equals big-batch steps at the rule's LR
with strategy.scope():
    traced = mlp()
    traced.compile(Optimizer(keras.optimizers.SGD(0.05), 1), loss="mse")
sizes = [8, 4, 12, 24]
log = elastic_tf.fit_trace(traced, x, y, sizes, micro_batch=2, base_lr=0.05, ref_batch_size=8, seed=3)
reference, sgd = mlp(), keras.optimizers.SGD(0.05)
epoch = Schedule(sizes, 48, num_replicas=2, micro_batch=2, seed=3, balanced=True).epoch(0)
for step, size in enumerate(sizes):
    sgd.learning_rate = scaled_lr(0.05, size, 8, "linear", step=step)
    rows = epoch.step_indices(step)
    sgd.apply(gradients(reference, x[rows], y[rows]), reference.trainable_variables)
results["trace_difference"] = max_difference(traced, reference)
results["trace_ga_steps"] = [row["ga_steps"] for row in log]

# a plan that uses fewer devices narrows the strategy it was given
plan = elastic_tf.init(9, 9, strategy=tf.distribute.MirroredStrategy(DEVICES), verbose=False)
results["narrowed"] = [plan.gpus, elastic_tf.strategy.num_replicas_in_sync]

print("RESULTS " + json.dumps(results))
