"""aikit's Keras GA against Keras' built-in ``gradient_accumulation_steps``, side by side.

Both train the same MLP from the same weights on the same synthetic data with the same
micro-batch and GA steps, through ``model.fit`` (graph mode); the runs alternate so that
drift in the machine hits both alike. Prints the median time per update of each, their ratio
(aikit / Keras; the aim is <= 1.05), and the largest weight difference after one run (both
compute the same updates with a constant LR).

    python benchmarks/ga_keras.py [--repeats 9] [--updates 40] [--steps 4] [--micro-batch 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from aikit.ga.TF.optimizers import Optimizer


def make_model(features: int, width: int, classes: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(classes)])


def compiled(kind: str, steps: int, args) -> keras.Model:
    model = make_model(args.features, args.width, args.classes)
    if kind == "keras":
        optimizer = keras.optimizers.Adam(1e-3, gradient_accumulation_steps=steps)
    else:
        optimizer = Optimizer(keras.optimizers.Adam(1e-3), steps)
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--updates", type=int, default=40, help="updates timed per run")
    parser.add_argument("--steps", type=int, default=4, help="GA micro-steps per update")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="TensorFlow intra- and inter-op threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    rng = np.random.default_rng(0)
    samples = args.updates * args.steps * args.micro_batch
    x = rng.normal(size=(samples, args.features)).astype("float32")
    y = rng.integers(0, args.classes, size=samples)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.micro_batch).cache()

    models = {kind: compiled(kind, args.steps, args) for kind in ("keras", "aikit")}
    for model in models.values():  # trace and warm up outside the timing
        model.fit(data.take(args.steps * 2), epochs=1, verbose=0, shuffle=False)
    times: dict[str, list[float]] = {kind: [] for kind in models}
    for repeat in range(args.repeats):
        order = list(models) if repeat % 2 == 0 else list(models)[::-1]  # neither always runs first
        for kind in order:
            start = time.perf_counter()
            models[kind].fit(data, epochs=1, verbose=0, shuffle=False)
            times[kind].append((time.perf_counter() - start) / args.updates)

    fresh = {kind: compiled(kind, args.steps, args) for kind in models}
    for model in fresh.values():
        model.fit(data, epochs=1, verbose=0, shuffle=False)
    difference = max(float(np.abs(a - b).max())
                     for a, b in zip(fresh["keras"].get_weights(), fresh["aikit"].get_weights(), strict=True))

    medians = {kind: statistics.median(t) for kind, t in times.items()}
    print(f"GA over {args.steps} micro-batches of {args.micro_batch}, MLP {args.features}-{args.width}-"
          f"{args.width}-{args.classes}, {args.updates} updates x {args.repeats} repeats, "
          f"TF {tf.__version__}, Keras {keras.__version__}")
    for kind, median in medians.items():
        print(f"  {kind:>5}: median {median * 1e3:.2f} ms per update")
    paired = statistics.median(a / k for a, k in zip(times["aikit"], times["keras"], strict=True))
    print(f"ratio aikit / keras: {medians['aikit'] / medians['keras']:.3f} "
          f"(median of the {args.repeats} paired ratios: {paired:.3f})")
    print(f"largest weight difference after {args.updates} updates: {difference:.2e}")


if __name__ == "__main__":
    main()
