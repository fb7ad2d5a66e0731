"""Run:AI's AIkit Elastic for Keras: a small CNN on the embedded digits, elastic in its hardware.

The global batch stays 128 whatever runs it; aikit plans GA steps and micro-batches for the
devices it finds (one CPU: 4 GA steps of 32; two GPUs: MirroredStrategy on TensorFlow,
DataParallel on JAX, 2 steps of 32 each; a TPU: TPUStrategy), on the backend Keras runs on
(KERAS_BACKEND: tensorflow, Keras' default, jax or torch). Takes about half a minute on a CPU:

    python examples/keras_elastic_digits.py
    KERAS_BACKEND=jax python examples/keras_elastic_digits.py
    python examples/keras_elastic_digits.py --cpu-replicas 2   # 2 logical CPUs: MirroredStrategy (JAX: DataParallel)
    python examples/keras_elastic_digits.py --global-batch 256 --max-batch 64 --epochs 30
"""

from __future__ import annotations

import argparse
import os
import sys


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--max-batch", type=int, default=32, help="the largest batch one device holds")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--cpu-replicas", type=int, default=0,
                        help="split the CPU into this many logical devices under MirroredStrategy "
                             "(how several GPUs would run, without GPUs)")
    return parser.parse_args()


ARGS = arguments()
if ARGS.cpu_replicas > 1 and os.environ.get("KERAS_BACKEND") == "jax":  # before JAX starts
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ARGS.cpu_replicas}"

import keras  # noqa: E402  (its backend: KERAS_BACKEND)

import aikit.keras.elastic  # noqa: E402
from aikit.datasets import digits  # noqa: E402


def main(args: argparse.Namespace = ARGS) -> float:
    strategy = None
    if args.cpu_replicas > 1 and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.cpu_replicas)])
    aikit.keras.elastic.init(args.global_batch, args.max_batch, strategy=strategy)
    x_train, y_train, x_test, y_test = digits()
    x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)  # channels last

    keras.utils.set_random_seed(0)
    # built after init: on TensorFlow the wrapper moves it under the strategy, on JAX it is on the mesh
    cnn = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model = aikit.keras.elastic.Model(cnn)
    model.compile(
        optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=250)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x_train, y_train, batch_size=aikit.keras.elastic.batch_size, epochs=args.epochs, verbose=2)
    if aikit.keras.elastic.distribution is not None:  # a JAX mesh shards every batch: whole batches only (keras#21167)
        x_test, y_test = (part[:len(part) - len(part) % model.step_batch_size] for part in (x_test, y_test))
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    updates = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    if aikit.keras.elastic.master:
        print(f"held-out accuracy {accuracy:.4f} after {updates} updates of {args.global_batch} samples")
    return accuracy


if __name__ == "__main__":
    sys.exit(0 if main() >= 0.95 else 1)
