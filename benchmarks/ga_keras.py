"""aikit's Keras GA against Keras' own ``gradient_accumulation_steps``, on all three backends in one run.

Keras picks its backend once per process, so each (backend, GA) pair trains in a process of its
own: the same MLP (AdamW) from the same weights on the same synthetic data with the same
micro-batch and GA steps, through ``model.fit`` (compiled steps; XLA on JAX, eager on torch).
Each process reports its median time per update over ``--repeats`` epochs after a warm-up epoch,
and its peak resident memory (the process's, framework included: compare within a backend).
Prints one row per backend with the ratio aikit / Keras (the issue's goals: <= 1.0 on every
backend, <= 0.8 on JAX, where Keras runs the whole AdamW update on every micro-step and keeps the
old values with ``lax.cond``) and the largest weight difference after one epoch (float32).

    python benchmarks/ga_keras.py [--repeats 5] [--updates 10] [--steps 4] [--micro-batch 32] [--width 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

BACKENDS = ("tensorflow", "jax", "torch")
GOALS = {"tensorflow": 1.0, "jax": 0.8, "torch": 1.0}


def measure(args) -> dict:
    """One backend and one GA in this process (KERAS_BACKEND set by the parent)."""
    import resource
    import statistics
    import time

    import keras
    import numpy as np

    from aikit.keras import Optimizer

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((args.features,)),
                              *[keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)],
                              keras.layers.Dense(args.classes)])
    inner = dict(learning_rate=1e-3, weight_decay=0.01)
    optimizer = (keras.optimizers.AdamW(**inner, gradient_accumulation_steps=args.steps) if args.kind == "keras"
                 else Optimizer(keras.optimizers.AdamW(**inner), args.steps))
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    samples = args.updates * args.steps * args.micro_batch
    x = rng.normal(size=(samples, args.features)).astype("float32")
    y = rng.integers(0, args.classes, size=samples)
    model.fit(x, y, batch_size=args.micro_batch, epochs=1, shuffle=False, verbose=0)  # compile and warm up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        model.fit(x, y, batch_size=args.micro_batch, epochs=1, shuffle=False, verbose=0)
        times.append((time.perf_counter() - start) / args.updates)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return {"seconds": statistics.median(times), "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "parameters": int(model.count_params()), "weights": weights[:: max(1, len(weights) // 20000)].tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--updates", type=int, default=10, help="updates per timed epoch")
    parser.add_argument("--steps", type=int, default=4, help="GA micro-steps per update")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kind:  # a child: one backend, one GA
        print(json.dumps(measure(args)))
        return

    rows = {}
    for backend in args.backends.split(","):
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        results = {}
        for kind in ("keras", "aikit"):
            done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--kind", kind], env=env,
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"{backend}/{kind} failed:\n{done.stderr[-3000:]}")
            results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
        rows[backend] = results
    first = next(iter(rows.values()))["aikit"]
    print(f"GA over {args.steps} micro-batches of {args.micro_batch}, AdamW, MLP {args.features}-"
          f"{'-'.join([str(args.width)] * args.layers)}-{args.classes} ({first['parameters']:,} parameters), "
          f"{args.updates} updates x {args.repeats} epochs, median time per update")
    print(f"{'backend':<11} {'Keras ms':>9} {'aikit ms':>9} {'ratio':>6} {'goal':>5}  {'Keras MiB':>9} "
          f"{'aikit MiB':>9}  {'weights differ':>14}")
    for backend, result in rows.items():
        keras_run, aikit_run = result["keras"], result["aikit"]
        ratio = aikit_run["seconds"] / keras_run["seconds"]
        differ = max(abs(a - b) for a, b in zip(keras_run["weights"], aikit_run["weights"], strict=True))
        verdict = "met" if ratio <= GOALS[backend] else "MISSED"
        print(f"{backend:<11} {keras_run['seconds'] * 1e3:9.1f} {aikit_run['seconds'] * 1e3:9.1f} {ratio:6.2f} "
              f"<={GOALS[backend]:<4} {keras_run['peak_mib']:9.0f} {aikit_run['peak_mib']:9.0f}  {differ:14.1e}  "
              f"{verdict}")


if __name__ == "__main__":
    main()
