"""The LR range test for Keras 3 models (TensorFlow backend), with the torch finder's options.

On one device, a short training loop of its own (``tf.GradientTape``) rather than ``fit``: the
test needs to set the LR before every update, accumulate micro-batches into one update and stop
on a diverging loss, and it must leave the model and optimizer as it found them. A model built
under a ``tf.distribute`` strategy with several replicas (``MirroredStrategy``, ...) trains
through ``model.fit`` instead, which splits every batch over the replicas and all-reduces, with
a callback that sets each update's LR and reads its loss. The loop, LR sequence, smoothing,
stop rule and suggestions are ``aikit.core.lr_range``'s; this module trains one update and
validates, in TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from aikit.core import lr_range
from aikit.core.errors import InvalidState, InvalidType, InvalidValue, TrainingFailed
from aikit.core.validate import positive_int
from aikit.keras.optimizers import Optimizer as GAOptimizer
from aikit.lr_finder.results import RangeTestResults
from aikit.lr_finder.state_cache import StateCache
from aikit.runtime.Keras.backend import keras

_SPARE_STEPS = 1000  # fit steps beyond the test's for updates a LossScaleOptimizer skips (fit stops when it is done)


class LRFinder(RangeTestResults):
    """Learning rate range test for a Keras model.

    ``optimizer`` and ``criterion`` default to what ``model`` was compiled with (the compiled
    loss, metrics-free, plus the model's regularization losses); a ``criterion`` is called as
    Keras losses are, ``criterion(y_true, y_pred)``. The model (which must be built) and the
    optimizer's variables are saved now, in memory or as a ``.npz`` under ``cache_dir`` with
    ``memory_cache=False``, so that ``reset()`` can restore them.

    Through aikit's GA optimizer (``aikit.ga.TF.optimizers.Optimizer``, as
    ``aikit.elastic.TF.model.Model`` compiles) each update of the test is the optimizer's
    ``steps`` batches, at one LR: the range test of the global batch.

    Example::

        model.compile(optimizer=keras.optimizers.SGD(1e-5), loss="sparse_categorical_crossentropy")
        finder = LRFinder(model)
        finder.range_test((x_train, y_train), end_lr=10, num_iter=100, batch_size=64)
        ax, lr = finder.plot()
        finder.reset()
    """

    def __init__(self, model, optimizer=None, criterion=None, memory_cache: bool = True,
                 cache_dir: str | None = None):
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is None:
            raise InvalidValue("the model has no optimizer: compile it with one or pass optimizer=")
        if criterion is None and getattr(model, "loss", None) is None:
            raise InvalidValue("the model has no loss: compile it with one or pass criterion=")
        if not model.built:
            raise InvalidValue(
                "the model is not built, so its weights cannot be saved for reset(): give it a "
                "keras.Input or call it on one batch first"
            )
        if isinstance(getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
            raise InvalidState(
                "the optimizer's learning rate is a LearningRateSchedule; the range test sets the LR "
                "itself: run it with an optimizer built with a float learning_rate"
            )
        if not model.trainable_variables:
            raise InvalidValue("the model has no trainable weights: the range test trains them, so give it a model "
                               "with trainable weights")
        self.model = model
        self.optimizer = optimizer
        if isinstance(criterion, str):
            criterion = keras.losses.get(criterion)
        if criterion is not None and not isinstance(criterion, keras.losses.Loss):
            criterion = _FunctionLoss(criterion)
        self.criterion = criterion
        self.history = {"lr": [], "loss": []}
        self.best_loss = None
        if not optimizer.built:
            with model.distribute_strategy.scope():  # a distributed model's slots are mirrored
                optimizer.build(model.trainable_variables)
        self._cache = _ArrayCache(memory_cache, cache_dir)
        self._cache.store("keras", model.get_weights() + [v.numpy() for v in optimizer.variables])

    def reset(self) -> None:
        """Restore the model's weights and the optimizer's variables (its LR and state)."""
        values = self._cache.retrieve("keras")
        weights = len(self.model.get_weights())
        self.model.set_weights(values[:weights])
        for variable, value in zip(self.optimizer.variables, values[weights:], strict=True):
            variable.assign(value)

    def range_test(
        self,
        train_data,
        val_data=None,
        start_lr: float | None = None,
        end_lr: float = 10,
        num_iter: int = 100,
        step_mode: str = "exp",
        smooth_f: float = 0.05,
        diverge_th: float = 5,
        accumulation_steps: int = 1,
        *,
        batch_size: int = 32,
        shuffle: bool = True,
        progress_bar: bool = True,
    ) -> None:
        """Train ``num_iter`` updates while the LR climbs to ``end_lr``; fill ``self.history``.

        ``train_data`` and ``val_data`` are ``tf.data.Dataset`` of ``(x, y)`` or
        ``(x, y, sample_weight)`` batches, or tuples of arrays ``(x, y)`` batched by
        ``batch_size`` (the training one shuffled unless ``shuffle=False``). The training
        data is repeated as needed. Everything else is as in the torch finder: the recorded
        loss is the update's mean training loss over ``accumulation_steps`` micro-batches, or
        the mean loss over the whole validation set, smoothed; the test stops on divergence or
        a non-finite loss; the optimizer's LR is put back afterwards.

        A model built under a strategy with several replicas trains through ``model.fit``: each
        update is one batch of ``batch_size`` samples split over the replicas (so
        ``accumulation_steps`` must be 1; raise ``batch_size`` instead), with the compiled loss
        and optimizer (no ``criterion``).
        """
        lr_now = float(self.optimizer.learning_rate.numpy())
        test = lr_range.RangeTest(self, [lr_now if start_lr is None else start_lr], end_lr, num_iter, step_mode,
                                  smooth_f, diverge_th, validate=val_data is not None, val_average="seen",
                                  progress_bar=progress_bar)
        accumulation_steps = positive_int(accumulation_steps, "accumulation_steps")
        batch_size = positive_int(batch_size, "batch_size")
        train = _dataset(train_data, "train_data", batch_size, shuffle).repeat()
        val = None if val_data is None else _dataset(val_data, "val_data", batch_size, shuffle=False)
        ga = self.optimizer if isinstance(self.optimizer, GAOptimizer) else None
        if ga is not None:
            self._check_ga(ga, accumulation_steps)
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        if replicas > 1:
            self._check_fit_path(replicas, accumulation_steps)
        update = _Update(self.model, self.optimizer, self.criterion, train, val, accumulation_steps)
        if replicas == 1:
            test.run(update)
            return
        with test.running(update):  # fit owns the loop: one batch per micro-step, split over the replicas
            self.model.fit(train, epochs=1, steps_per_epoch=test.num_iter * (ga.steps if ga else 1) + _SPARE_STEPS,
                           verbose=0, callbacks=[_RangeTestCallback(test, self.optimizer)])

    @staticmethod
    def _check_ga(ga: GAOptimizer, accumulation_steps: int) -> None:
        """A range test through the GA optimizer: one update per ``ga.steps`` batches."""
        if accumulation_steps != 1:
            raise InvalidValue(
                f"accumulation_steps={accumulation_steps} through aikit's GA optimizer, which accumulates "
                f"steps={ga.steps} batches per update itself: leave accumulation_steps out"
            )
        if ga.accumulated:
            raise InvalidValue(
                f"aikit's GA optimizer has {ga.accumulated} of its {ga.steps} batches accumulated: run the range "
                "test between updates"
            )

    def _check_fit_path(self, replicas: int, accumulation_steps: int) -> None:
        strategy = type(self.model.distribute_strategy).__name__
        where = f"under {strategy} ({replicas} replicas) the test trains through fit"
        if accumulation_steps != 1:
            raise InvalidValue(f"{where}, one batch per update: use accumulation_steps=1 and a larger batch_size, "
                               f"got accumulation_steps={accumulation_steps}")
        if self.criterion is not None:
            raise InvalidValue(f"{where} with the compiled loss: compile the model with the criterion instead")
        if self.optimizer is not self.model.optimizer:
            raise InvalidValue(f"{where} with the compiled optimizer: compile the model with the optimizer instead")


class _Update:
    """One test's :class:`aikit.core.lr_range.Trainer`: the optimizer's LR, one update over
    ``accumulation_steps`` micro-batches (a ``tf.GradientTape`` of its own), the validation
    pass. Its tf.functions are its own, so the finder is not in their reference cycle (and
    its disk cache goes with it after ``del``)."""

    empty_validation = "val_data yields no samples: give a validation set with data, or leave val_data out"

    def __init__(self, model, optimizer, criterion, train: tf.data.Dataset, val: tf.data.Dataset | None,
                 accumulation_steps: int):
        self.model, self.optimizer, self.criterion = model, optimizer, criterion
        self.train, self.val, self.accumulation_steps = train, val, accumulation_steps
        self._batches = None
        self._gradients = tf.function(self._gradients_of, reduce_retracing=True)
        self._apply = tf.function(self._apply_gradients, reduce_retracing=True)
        self._evaluate = tf.function(self._loss_of_batch, reduce_retracing=True)

    def lrs(self) -> list[float]:
        return [float(self.optimizer.learning_rate.numpy())]

    def set_lrs(self, lrs: Sequence[float]) -> None:
        (lr,) = lrs  # a Keras optimizer has one LR
        self.optimizer.learning_rate = lr

    def train_update(self) -> float | None:
        """One update over ``accumulation_steps`` micro-batches (through aikit's GA optimizer: its
        ``steps``, each applied to it, which updates on the last); returns their mean loss, or None
        when the update was skipped (a ``LossScaleOptimizer`` found inf/NaN gradients at a finite loss)."""
        if self._batches is None:
            self._batches = iter(self.train)
        ga = isinstance(self.optimizer, GAOptimizer)
        steps = self.optimizer.steps if ga else self.accumulation_steps
        updates = int(self.optimizer.iterations.numpy())  # counts updates applied, not skipped ones
        total_loss, total_grads = 0.0, None
        for _ in range(steps):
            batch = next(self._batches, None)
            if batch is None:
                raise InvalidValue("train_data yields no batches: give the range test data to train on")
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            grads, loss = self._gradients(x, y, sample_weight, 1 if ga else steps)
            if ga:  # the GA optimizer sums and averages the micro-batches itself
                self._apply(grads)
                loss = loss / steps
            else:
                total_grads = grads if total_grads is None else [a + b for a, b in zip(total_grads, grads,
                                                                                       strict=True)]
            total_loss += float(loss)
        if not ga:
            self._apply(total_grads)
        applied = int(self.optimizer.iterations.numpy()) > updates
        return total_loss if applied or not math.isfinite(total_loss) else None

    def evaluate(self) -> tuple[float, int]:
        running_loss, samples = 0.0, 0
        for batch in self.val:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            count = int(tf.shape(tf.nest.flatten(x)[0])[0])
            running_loss += float(self._evaluate(x, y, sample_weight, False)) * count
            samples += count
        return running_loss, samples

    def _loss_of_batch(self, x, y, sample_weight, training: bool):
        y_pred = self.model(x, training=training)
        if self.criterion is None:
            return self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        loss = self.criterion(y, y_pred, sample_weight)
        return loss + tf.add_n(self.model.losses) if self.model.losses else loss

    def _gradients_of(self, x, y, sample_weight, accumulation_steps: int):
        with tf.GradientTape() as tape:
            loss = self._loss_of_batch(x, y, sample_weight, True) / accumulation_steps
            scaled = self.optimizer.scale_loss(loss)  # a LossScaleOptimizer's mixed precision
        return tape.gradient(scaled, self.model.trainable_variables), loss

    def _apply_gradients(self, grads):
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))


class _RangeTestCallback(keras.callbacks.Callback):
    """Begins an update of the range test at the ``fit`` step that starts one and ends it with
    its own loss (through aikit's GA optimizer an update is its ``steps`` fit steps, their mean).

    Keras hands callbacks the running mean over the epoch; each step's loss is read from the
    loss tracker's running sums instead (reduced over the replicas), as AutoLRS's callback does.
    An update the optimizer skipped (its ``iterations`` did not advance: a ``LossScaleOptimizer``
    found inf/NaN gradients) is not ended, so it is made again at the same LR.
    """

    def __init__(self, test: lr_range.RangeTest, optimizer):
        super().__init__()
        self.test, self.optimizer = test, optimizer
        self.ga = optimizer if isinstance(optimizer, GAOptimizer) else None
        self.sums_before = (0.0, 0.0)
        self.losses: list[float] = []
        self.updates = 0
        self.skipped = 0

    def on_train_batch_begin(self, batch, logs=None):
        if not self.losses:  # the first micro-step of an update
            self.test.begin_update()
            self.updates = int(self.optimizer.iterations.numpy())
        self.sums_before = self._loss_sums()

    def on_train_batch_end(self, batch, logs=None):
        total, count = self._loss_sums()
        self.losses.append((total - self.sums_before[0]) / (count - self.sums_before[1]))
        if self.ga is not None and self.ga.accumulated:  # the update is not made yet
            return
        loss, self.losses = sum(self.losses) / len(self.losses), []
        if int(self.optimizer.iterations.numpy()) == self.updates and math.isfinite(loss):
            self.skipped += 1
            if self.skipped > lr_range.MAX_SKIPPED:
                raise TrainingFailed(f"{lr_range.MAX_SKIPPED} updates in a row were skipped for inf/NaN gradients "
                                     "although their losses were finite: check the model and the loss")
            return
        self.skipped = 0
        if self.test.end_update(loss):
            self.model.stop_training = True

    def _loss_sums(self) -> tuple[float, float]:
        tracker = next(m for m in self.model.metrics if m.name == "loss")
        return float(tracker.total.numpy()), float(tracker.count.numpy())


class _FunctionLoss(keras.losses.Loss):
    """A plain ``fn(y_true, y_pred)`` with Keras' own reduction and sample weighting."""

    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


def _dataset(data, name: str, batch_size: int, shuffle: bool) -> tf.data.Dataset:
    if isinstance(data, tf.data.Dataset):
        return data
    if isinstance(data, (tuple, list)) and len(data) in (2, 3):
        lengths = [len(part) for part in data]
        if len(set(lengths)) > 1:
            parts = ", ".join(f"{part} {length}" for part, length in zip(("x", "y", "sample_weight"), lengths,
                                                                          strict=False))
            raise InvalidValue(f"`{name}` holds arrays of different lengths ({parts}): give one entry per sample in "
                               "each")
        dataset = tf.data.Dataset.from_tensor_slices(tuple(data))
        if shuffle:
            dataset = dataset.shuffle(len(data[0]), reshuffle_each_iteration=True)
        return dataset.batch(batch_size)
    raise InvalidType(
        f"`{name}` has unsupported type: {type(data)}. Expected a tf.data.Dataset of (x, y) "
        "batches or a tuple (x, y) of arrays."
    )


class _ArrayCache(StateCache):
    """A list of arrays, in memory or as a ``.npz`` file (removed with the cache)."""

    suffix = ".npz"

    def _write(self, values: list[np.ndarray], path: str) -> None:
        np.savez(path, *values)

    def _read(self, path: str) -> list[np.ndarray]:
        with np.load(path) as saved:
            return [saved[f"arr_{i}"] for i in range(len(saved.files))]
