"""One of two JAX processes on localhost (tests/test_keras_backends.py): joined by
keras.distribution.initialize, aikit's init plans both processes' devices, Model.fit trains the
global batch over them; prints this process's plan and its weights' largest difference from the
one-device big batch (as JSON)."""

from __future__ import annotations

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

import jax

jax.config.update("jax_enable_x64", True)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import aikit.keras.elastic as elastic  # noqa: E402

port, rank = sys.argv[1], int(sys.argv[2])
keras.distribution.initialize(f"localhost:{port}", num_processes=2, process_id=rank)
keras.config.set_floatx("float64")
keras.config.set_dtype_policy("float64")
sys.path.insert(0, os.path.dirname(__file__))
from common import data, mlp  # noqa: E402

plan = elastic.init(16, 4, verbose=False)
x, y = data(48)
model = elastic.Model(mlp())
model.compile(keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
# this process's share of every micro-step: the plan deals device d its slice of the step's batch
local = np.concatenate([np.arange(s + rank * 4, s + rank * 4 + 4) for s in range(0, 48, 8)])
model.fit(x[local], y[local], epochs=1, shuffle=False, verbose=0)
weights = [np.asarray(w) for w in model.model.get_weights()]
keras.distribution.set_distribution(None)
big = mlp()
big.compile(keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
big.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
difference = max(float(np.abs(a - b).max()) for a, b in zip(weights, big.get_weights(), strict=True))
print(json.dumps({"rank": rank, "gpus": plan.gpus, "steps": plan.steps, "processes": jax.process_count(),
                  "master": plan.master, "difference": difference}))
