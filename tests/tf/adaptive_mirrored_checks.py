"""The adaptive batch under MirroredStrategy over two logical CPU devices, printed as JSON.

A separate process because the logical devices must be configured before TensorFlow
initialises its devices; test_adaptive_mirrored.py runs it once and asserts on what it prints.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from two_cpus import calls, strategy

# isort: split
import numpy as np
from keras_adaptive_common import ScriptedController, big_batch_reference, brute_force_noise
from tf_common import data, keras, max_difference, mlp

from aikit.core.trace import load_trace
from aikit.elastic.TF import fit_adaptive, fit_trace
from aikit.ga.TF.noise import NoiseOptimizer
from aikit.ga.TF.optimizers import Optimizer
from aikit.runtime.Keras.backend import seam

train_micro_step = seam.train_micro_step

keras.config.set_floatx("float64")
keras.config.set_dtype_policy("float64")
results: dict = {}
x, y = data(49)


def momentum():
    return keras.optimizers.SGD(0.05, momentum=0.9)


# the noise of every update, against numpy part by part: 3 micro-steps x 2 replicas = 6 parts;
# run eagerly (every reduction the updates perform is counted) and traced
for name, make, eagerly in (("noise", NoiseOptimizer, True), ("plain", Optimizer, True),
                            ("noise_traced", NoiseOptimizer, False)):
    with strategy.scope():
        model = mlp()
        model.compile(make(keras.optimizers.SGD(0.1), 3), loss="mse", run_eagerly=eagerly)
    calls.clear()
    differences = []
    for update in range(2):
        # micro-step m: replica r trains on 4 samples of its own
        parts = [[np.arange(update * 24 + m * 8 + r * 4, update * 24 + m * 8 + (r + 1) * 4) for r in range(2)]
                 for m in range(3)]
        plain = mlp()
        plain.set_weights(model.get_weights())
        expected = brute_force_noise(plain, x, y, [rows for step in parts for rows in step])
        rows = np.concatenate(parts[0])
        before = float(np.mean(np.square(plain(x[rows]).numpy() - y[rows])))
        results["loss_difference"] = abs(train_micro_step(model, x, y, parts[0]) - before)  # the mean over both
        for step in parts[1:]:
            train_micro_step(model, x, y, step)
        if make is NoiseOptimizer:
            found = model.optimizer.noise(4)
            differences.append(max(abs(found.grad_sq / expected.grad_sq - 1), abs(found.trace / expected.trace - 1)))
    results[f"{name}_reductions"] = list(calls)  # tensors in each reduction (eager: one reduction per update)
    if differences:
        results[f"{name}_relative_difference"] = max(differences)

# fit_adaptive: plans 2 replicas x (2x2 -> 3x4 -> 1x4 -> 3x3) on 49 samples, traced as usual
with strategy.scope():
    adaptive = mlp()
    adaptive.compile(NoiseOptimizer(momentum()), loss="mse")
controller = ScriptedController({2: 24, 4: 8, 6: 18}, 4, 2, ref_batch_size=8, max_batch=24)
trace = sys.argv[1]  # where the run writes its trace
rows = fit_adaptive(adaptive, x, y, controller, base_lr=0.05, rule="sqrt", epochs=2, seed=5, trace_path=trace)
results["batches"] = [r["batch_size"] for r in rows]
results["ga_steps"] = [r["ga_steps"] for r in rows]
results["micro_batches"] = [r["micro_batch"] for r in rows]
results["epochs"] = [r["epoch"] for r in rows]
results["adaptive_difference"] = max_difference(adaptive, big_batch_reference(x, y, rows, 5, momentum))
results["noise_measured"] = [bool(np.isfinite(r["trace"])) for r in rows]

# fit_adaptive's noise: one update of 2 micro-steps x 2 replicas (16 samples in order), each
# replica on its own 4 samples, against numpy part by part
with strategy.scope():
    measured = mlp()
    measured.compile(NoiseOptimizer(momentum()), loss="mse")
expected = brute_force_noise(mlp(), x, y, [np.arange(4 * p, 4 * p + 4) for p in range(4)])
fit_adaptive(measured, x[:16], y[:16], ScriptedController({}, 4, 2, ref_batch_size=16, max_batch=16), base_lr=0.05,
             shuffle=False)
found = measured.optimizer.noise(4)
results["fit_adaptive_noise_difference"] = max(abs(found.grad_sq / expected.grad_sq - 1),
                                               abs(found.trace / expected.trace - 1))

# the trace replays the run with fit_trace under the same strategy
with strategy.scope():
    replay = mlp()
    replay.compile(Optimizer(momentum()), loss="mse")
# 'stop': the last epoch leaves one sample out (49 over 2 replicas), which only the end of the trace says
fit_trace(replay, x, y, load_trace(trace, "stop"), micro_batch=1, base_lr=0.05, ref_batch_size=8, rule="sqrt",
          epochs=2, seed=5)
results["replay_difference"] = max_difference(adaptive, replay)

print("RESULTS " + json.dumps(results))
