"""aikit picks the batch size (Keras): goodput-driven adaptive batch on the embedded digits.

A GoodputController (Pollux/AdaptDL's rule) starts at a global batch of 96 (2 GA steps of 48) and may grow it up to
512 whenever the predicted goodput -- throughput x statistical efficiency, from the gradient
noise measured inside the GA optimizer -- gains more than 5 %; every update stays equal to one
big-batch step, the LR follows AdaScale's gain, and the batches are written as a
``step,batchsize`` trace that ``fit_trace`` replays. Runs in seconds on a CPU:

    python examples/adaptive_keras_digits.py
    python examples/adaptive_keras_digits.py --cpu-replicas 2          # MirroredStrategy over 2 logical CPUs
    python examples/adaptive_keras_digits.py --plot adaptive.png       # batch, noise scale and LR over the run

Exits with code 1 when the test accuracy is under --target.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from aikit.core.goodput import GoodputController
from aikit.datasets import digits
from aikit.elastic.TF import fit_adaptive
from aikit.ga.TF.noise import NoiseOptimizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--ref-batch-size", type=int, default=96, help="the batch the LR is tuned for (the start)")
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--max-device-batch", type=int, default=64, help="the largest micro-batch one device holds")
    parser.add_argument("--lr", type=float, default=0.08, help="SGD's LR at --ref-batch-size")
    parser.add_argument("--rule", default="adascale", choices=["adascale", "sqrt", "linear", "constant"])
    parser.add_argument("--cpu-replicas", type=int, default=0,
                        help="split the CPU into this many logical devices under MirroredStrategy")
    parser.add_argument("--trace", default="adaptive_trace.csv", help="where to write the chosen batches")
    parser.add_argument("--plot", help="draw the batch, noise scale and LR over the run to this PNG")
    parser.add_argument("--target", type=float, default=0.9, help="least acceptable test accuracy")
    args = parser.parse_args()

    strategy = tf.distribute.get_strategy()
    if args.cpu_replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.cpu_replicas)])
    replicas = strategy.num_replicas_in_sync
    x_train, y_train, x_test, y_test = digits()
    x_train, x_test = x_train.reshape(len(x_train), -1), x_test.reshape(len(x_test), -1)

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(NoiseOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    controller = GoodputController(args.max_device_batch, replicas, ref_batch_size=args.ref_batch_size,
                                   max_batch=args.max_batch, policy="error")  # Keras: equal micro-batches
    rows = fit_adaptive(model, x_train, y_train, controller, base_lr=args.lr, rule=args.rule, epochs=args.epochs,
                        trace_path=args.trace)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    for update, old, new, predicted in controller.changes:
        print(f"update {update}: batch {old} -> {new} (predicted goodput x{predicted:.2f})")
    noise = controller.noise.smoothed
    print(f"{len(rows)} updates on {replicas} replica(s), final batch {controller.batch}, noise scale "
          f"{noise.noise_scale:.0f}, LR {rows[-1]['lr']:.4g}; held-out accuracy {accuracy:.4f}; "
          f"trace in {args.trace}; mean loss of the last epoch "
          f"{np.mean([r['loss'] for r in rows if r['epoch'] == args.epochs - 1]):.4f}")
    if args.plot:
        from aikit.plot_adaptive import plot_adaptive

        plot_adaptive(rows, args.plot, title="aikit adaptive batch (Keras, digits)")
        print(f"plot in {args.plot}")
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
