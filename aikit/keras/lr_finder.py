"""The LR range test for Keras 3 models, on every backend, with the torch finder's options.

On one device, a short training loop of its own rather than ``fit`` (its gradients from the
backend's seam: ``tf.GradientTape``, ``jax.value_and_grad``, torch's autograd): the
test needs to set the LR before every update, accumulate micro-batches into one update and stop
on a diverging loss, and it must leave the model and optimizer as it found them. A model built
under a ``tf.distribute`` strategy with several replicas (``MirroredStrategy``, ...), or on JAX
under a ``keras.distribution`` over several devices, trains through ``model.fit`` instead,
which splits every batch over the replicas and all-reduces, with a callback that sets each
update's LR and reads its loss. The loop, LR sequence, smoothing,
stop rule and suggestions are ``aikit.core.lr_range``'s; this module trains one update and
validates, with ``keras.ops``. On JAX the callback reaches the model through ``Callback.model``,
which syncs the state Keras' jitted steps carry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from aikit.core import lr_range
from aikit.core.errors import InvalidState, InvalidValue, TrainingFailed
from aikit.core.validate import positive_int
from aikit.keras.optimizers import Optimizer as GAOptimizer
from aikit.runtime.Keras.backend import check_backend, keras, seam, to_numpy
from aikit.runtime.range_results import RangeTestResults
from aikit.runtime.state_cache import StateCache

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
        check_backend("aikit.keras.lr_finder.LRFinder")
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
            with seam.model_scope(model):  # a distributed model's slots are mirrored, or laid out on its mesh
                optimizer.build(model.trainable_variables)
        self._cache = _ArrayCache(memory_cache, cache_dir)
        self._cache.store("keras", model.get_weights() + [to_numpy(v) for v in optimizer.variables])

    def reset(self) -> None:
        """Restore the model's weights and the optimizer's variables (its LR and state)."""
        values = self._cache.retrieve("keras")
        weights = len(self.model.get_weights())
        self.model.set_weights(values[:weights])
        for variable, value in zip(self.optimizer.variables, values[weights:], strict=True):
            variable.assign(value)

    def range_test(self, train_data, val_data=None, start_lr: float | None = None, end_lr: float = 10,
                   num_iter: int = 100, step_mode: str = "exp", smooth_f: float = 0.05, diverge_th: float = 5,
                   accumulation_steps: int = 1, *, batch_size: int = 32, shuffle: bool = True,
                   progress_bar: bool = True) -> None:
        """Train ``num_iter`` updates while the LR climbs to ``end_lr``; fill ``self.history``.

        ``train_data`` and ``val_data`` are tuples of arrays ``(x, y)`` (or ``(x, y, sample_weight)``),
        batched by ``batch_size`` (the training one shuffled unless ``shuffle=False``), or on
        TensorFlow ``tf.data.Dataset`` of such batches. The training
        data is repeated as needed. Everything else is as in the torch finder: the recorded
        loss is the update's mean training loss over ``accumulation_steps`` micro-batches, or
        the mean loss over the whole validation set, smoothed; the test stops on divergence or
        a non-finite loss; the optimizer's LR is put back afterwards.

        A model built under a strategy with several replicas trains through ``model.fit``: each
        update is one batch of ``batch_size`` samples split over the replicas (so
        ``accumulation_steps`` must be 1; raise ``batch_size`` instead), with the compiled loss
        and optimizer (no ``criterion``).
        """
        lr_now = float(to_numpy(self.optimizer.learning_rate))
        test = lr_range.RangeTest(self, [lr_now if start_lr is None else start_lr], end_lr, num_iter, step_mode,
                                  smooth_f, diverge_th, validate=val_data is not None, val_average="seen",
                                  progress_bar=progress_bar)
        accumulation_steps = positive_int(accumulation_steps, "accumulation_steps")
        batch_size = positive_int(batch_size, "batch_size")
        train = seam.batches(train_data, "train_data", batch_size, shuffle, repeat=True)
        val = None if val_data is None else seam.batches(val_data, "val_data", batch_size, shuffle=False)
        ga = self.optimizer if isinstance(self.optimizer, GAOptimizer) else None
        if ga is not None:
            self._check_ga(ga, accumulation_steps)
        replicas = seam.model_replicas(self.model)
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

    def _check_fit_path(self, num_replicas: int, accumulation_steps: int) -> None:
        strategy = type(getattr(self.model, "distribute_strategy", keras.distribution.distribution())).__name__
        where = f"under {strategy} ({num_replicas} replicas) the test trains through fit"
        if accumulation_steps != 1:
            raise InvalidValue(f"{where}, one batch per update: use accumulation_steps=1 and a larger batch_size, "
                               f"got accumulation_steps={accumulation_steps}")
        if self.criterion is not None:
            raise InvalidValue(f"{where} with the compiled loss: compile the model with the criterion instead")
        if self.optimizer is not self.model.optimizer:
            raise InvalidValue(f"{where} with the compiled optimizer: compile the model with the optimizer instead")


class _Update:
    """One test's :class:`aikit.core.lr_range.Trainer`: the optimizer's LR, one update over
    ``accumulation_steps`` micro-batches (gradients from the backend's seam), the validation
    pass. Its functions are its own, so the finder is not in their reference cycle (and
    its disk cache goes with it after ``del``)."""

    empty_validation = "val_data yields no samples: give a validation set with data, or leave val_data out"

    def __init__(self, model, optimizer, criterion, train, val, accumulation_steps: int):
        self.model, self.optimizer, self.criterion = model, optimizer, criterion
        self.train, self.val, self.accumulation_steps = train, val, accumulation_steps
        self._batches = None
        self._gradients = seam.gradient_function(model, self._loss_of_batch)
        self._apply = seam.compiled(self._apply_gradients)
        self._evaluate = seam.compiled(self._loss_of_batch)

    def lrs(self) -> list[float]:
        return [float(to_numpy(self.optimizer.learning_rate))]

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
        updates = int(to_numpy(self.optimizer.iterations))  # counts updates applied, not skipped ones
        total_loss, total_grads = 0.0, None
        for _ in range(steps):
            batch = next(self._batches, None)
            if batch is None:
                raise InvalidValue("train_data yields no batches: give the range test data to train on")
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            grads, loss = self._gradients(x, y, sample_weight, 1 if ga else steps, self.optimizer.scale_loss)
            if ga:  # the GA optimizer sums and averages the micro-batches itself
                self._apply(grads)
                loss = loss / steps
            else:
                total_grads = grads if total_grads is None else [a + b for a, b in zip(total_grads, grads,
                                                                                       strict=True)]
            total_loss += float(to_numpy(loss))
        if not ga:
            self._apply(total_grads)
        applied = int(to_numpy(self.optimizer.iterations)) > updates
        return total_loss if applied or not math.isfinite(total_loss) else None

    def evaluate(self) -> tuple[float, int]:
        running_loss, samples = 0.0, 0
        for batch in self.val:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
            count = int(keras.ops.shape(keras.tree.flatten(x)[0])[0])
            running_loss += float(to_numpy(self._evaluate(x, y, sample_weight, False))) * count
            samples += count
        return running_loss, samples

    def _loss_of_batch(self, x, y, sample_weight, training: bool):
        y_pred = self.model(x, training=training)
        if self.criterion is None:
            return self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        loss = self.criterion(y, y_pred, sample_weight)
        return loss + keras.ops.sum(keras.ops.stack(self.model.losses)) if self.model.losses else loss

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
        _ = self.model  # on JAX: the state Keras' steps carry synced into the variables, before the LR is set
        if not self.losses:  # the first micro-step of an update
            self.test.begin_update()
            self.updates = int(to_numpy(self.optimizer.iterations))
        self.sums_before = self._loss_sums()

    def on_train_batch_end(self, batch, logs=None):
        total, count = self._loss_sums()
        self.losses.append((total - self.sums_before[0]) / (count - self.sums_before[1]))
        if self.ga is not None and self.ga.accumulated:  # the update is not made yet
            return
        loss, self.losses = sum(self.losses) / len(self.losses), []
        if int(to_numpy(self.optimizer.iterations)) == self.updates and math.isfinite(loss):
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
        return float(to_numpy(tracker.total)), float(to_numpy(tracker.count))


class _FunctionLoss(keras.losses.Loss):
    """A plain ``fn(y_true, y_pred)`` with Keras' own reduction and sample weighting."""

    def __init__(self, fn):
        super().__init__(name=getattr(fn, "__name__", "loss"))
        self.fn = fn

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred)


class _ArrayCache(StateCache):
    """A list of arrays, in memory or as a ``.npz`` file (removed with the cache)."""

    suffix = ".npz"

    def _write(self, values: list[np.ndarray], path: str) -> None:
        np.savez(path, *values)

    def _read(self, path: str) -> list[np.ndarray]:
        with np.load(path) as saved:
            return [saved[f"arr_{i}"] for i in range(len(saved.files))]
