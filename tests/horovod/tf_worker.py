"""One Horovod rank training a Keras 3 model with aikit's Horovod GA; rank 0 also trains the
single-process big-batch reference. Usage: horovodrun -np 2 -H localhost:2 --gloo python tf_worker.py OUT"""

import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import horovod.tensorflow as hvd
import keras
import numpy as np

import aikit.elastic
import aikit.elastic.TF
from aikit.core.plan import micro_batch_slices
from aikit.elastic.TF import horovod

G, M, UPDATES = 8, 2, 5


def model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])


def sgd() -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(0.1, momentum=0.9)


def main(out: Path) -> None:
    hvd.init()
    keras.config.set_floatx("float64")
    rank = hvd.rank()
    try:  # 3 samples split evenly only over 1 of the 2 processes
        aikit.elastic.TF.init(3, 1, verbose=False)
        refused = ""
    except ValueError as error:
        refused = str(error)
    plan = aikit.elastic.TF.init(G, M, verbose=False)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(G * UPDATES, 4)), rng.normal(size=(G * UPDATES, 1))
    # this rank's micro-batches of every window of G samples, in training order
    mine = np.concatenate([np.arange(w * G, (w + 1) * G)[s] for w in range(UPDATES)
                           for s in micro_batch_slices(plan, rank)])
    net = model(seed=100 + rank)  # ranks start apart: BroadcastVariables must make them equal
    net.compile(horovod.DistributedOptimizer(sgd(), aikit.elastic.TF.steps), loss="mse")
    net.fit(x[mine], y[mine], batch_size=aikit.elastic.TF.batch_size, shuffle=False, verbose=0,
            callbacks=[horovod.BroadcastVariables()])
    # a NaN target in rank 1's micro-batch of the second window: every rank skips that update alike
    poisoned = model(seed=100 + rank)
    poisoned.compile(horovod.DistributedOptimizer(sgd(), aikit.elastic.TF.steps), loss="mse")
    y_poisoned = y[mine].copy()
    if rank == 1:
        y_poisoned[len(mine) // UPDATES] = np.nan
    poisoned.fit(x[mine], y_poisoned, batch_size=aikit.elastic.TF.batch_size, shuffle=False, verbose=0,
                 callbacks=[horovod.BroadcastVariables()])
    result = {"weights": [w.numpy() for w in net.weights], "updates": int(net.optimizer.iterations.numpy()),
              "skip": ([w.numpy() for w in poisoned.weights], int(poisoned.optimizer.iterations.numpy()),
                       poisoned.optimizer.skipped),
              "plan": {name: getattr(aikit.elastic, name) for name in aikit.elastic.PUBLIC}, "refused": refused,
              "hvd": aikit.elastic.hvd is hvd and aikit.elastic.TF.hvd is hvd}
    if rank == 0:  # one process, one step per window of G samples
        big = model(seed=100)
        big.compile(sgd(), loss="mse")
        big.fit(x, y, batch_size=G, shuffle=False, verbose=0)
        result["reference"] = [w.numpy() for w in big.weights]
        skipped = model(seed=100)
        skipped.compile(sgd(), loss="mse")
        keep = np.r_[0:G, 2 * G:G * UPDATES]  # the second window skipped
        skipped.fit(x[keep], y[keep], batch_size=G, shuffle=False, verbose=0)
        result["skip_reference"] = [w.numpy() for w in skipped.weights]
    np.save(out / f"rank{rank}.npy", np.array(result, dtype=object), allow_pickle=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
