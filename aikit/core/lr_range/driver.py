"""The range test's loop, written once for every framework: set the LRs, train one update,
validate, smooth, stop, record, and agree across replicas.

torch-lr-finder's loop with the framework left out. An adapter implements :class:`Trainer`
(the LRs, one update, one validation pass, in its framework's tensors) and, where replicas
train together, :class:`Replicas` (a sum and a broadcast over them); :class:`RangeTest` does
the rest. An adapter whose framework trains one update on demand calls :meth:`RangeTest.run`;
one whose framework owns the loop (Keras ``fit``) calls :meth:`RangeTest.begin_update` and
:meth:`RangeTest.end_update` from its callbacks inside ``with test.running(trainer):``.

An update is whatever happens between ``begin_update`` and ``end_update``: one batch, several
accumulated micro-batches, a GA wrapper's micro-steps. The iteration advances only in
``end_update``, so an update the framework skipped (an AMP step with inf gradients) can be left
uncounted by not ending it: the next ``begin_update`` sets the same LRs again (``run`` does this
when ``train_update`` returns None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

from tqdm.auto import tqdm

from aikit.core.errors import InvalidValue, TrainingFailed
from aikit.core.lr_range.rules import LossTracker, lr_sequence

VAL_AVERAGES = ("dataset", "seen")
MAX_SKIPPED = 30  # updates skipped in a row (AMP) before the test gives up: a GradScaler's scale has halved 30 times


class Trainer(Protocol):
    """What an adapter does for the range test, with its framework's tensors."""

    #: The refusal when the replicas validated on no sample at all, naming the adapter's argument.
    empty_validation: str

    def lrs(self) -> list:
        """Every param group's LR now; :class:`RangeTest` gives them back to :meth:`set_lrs` afterwards."""

    def set_lrs(self, lrs: Sequence[float]) -> None:
        """Set every param group's LR (one per group, in order) for the next update."""

    def train_update(self) -> float | None:
        """Make one update at the LRs set, over however many micro-batches it takes; return its
        training loss on this replica (the mean over its micro-batches) as a Python float, or None
        when the framework skipped the update (AMP found inf/NaN gradients at a finite loss): the
        test then makes it again at the same LRs, uncounted."""

    def evaluate(self) -> tuple[float, int]:
        """One pass over this replica's validation data, without training: ``(loss_sum, samples)``,
        the sum over batches of each batch's mean loss times its samples, and the samples."""

    def val_dataset_size(self) -> int:
        """``len()`` of the validation data set, torch-lr-finder's divisor (asked only with
        ``val_average="dataset"``)."""


class Replicas(Protocol):
    """The replicas that run the range test together, each with its own data."""

    size: int
    is_master: bool  # the one that prints and shows the progress bar

    def sum(self, values: Sequence[float]) -> list[float]:
        """Every value summed over the replicas (float64), the same list on every replica."""

    def broadcast(self, values: Sequence[float]) -> list[float]:
        """The master's values, on every replica."""


class OneProcess:
    """No replicas to agree with: one process, or a ``tf.distribute`` strategy that reduces in
    its own graph (the Keras adapter reads losses already reduced)."""

    size = 1
    is_master = True

    def sum(self, values: Sequence[float]) -> list[float]:
        return list(values)

    def broadcast(self, values: Sequence[float]) -> list[float]:
        return list(values)


ONE_PROCESS = OneProcess()


class RangeTest:
    """One LR range test (Smith, 2017; torch-lr-finder's loop), update by update.

    Param group ``g`` climbs from ``start_lrs[g]`` (the master's, under replicas) to ``end_lr``
    over ``num_iter`` updates (:func:`~aikit.core.lr_range.lr_sequence`). After each update the
    test records the first group's LR and a loss smoothed by ``smooth_f``: the update's
    training loss averaged over the replicas or, with ``validate``, the validation loss summed
    over every replica's batches (each batch's mean times its samples) and divided by
    ``val_average``'s count: ``"dataset"`` (torch-lr-finder's), the validation data set's
    length; ``"seen"``, the samples validated on (the default under replicas). It stops after
    ``num_iter`` updates, a loss above ``diverge_th`` times the best, or a non-finite one.

    ``results`` (the finder) gets ``history`` (``{"lr": [...], "loss": [...]}``) and
    ``best_loss`` now, emptied, and as the test goes, so an interrupted test keeps what it
    found. The constructor checks every argument and changes nothing else; collectives run
    only once the test runs.
    """

    def __init__(self, results, start_lrs: Sequence[float], end_lr: float = 10, num_iter: int = 100,
                 step_mode: str = "exp", smooth_f: float = 0.05, diverge_th: float = 5, *, validate: bool = False,
                 val_average: str | None = None, replicas: Replicas = ONE_PROCESS, progress_bar: bool = True):
        results.history = {"lr": [], "loss": []}
        results.best_loss = None
        self.results = results
        self._sweep = end_lr, num_iter, step_mode
        self.start_lrs = list(start_lrs)
        self._lrs = [lr_sequence(start, *self._sweep) for start in self.start_lrs]
        self.num_iter = len(self._lrs[0])
        downward = [start for start in self.start_lrs if not start < end_lr]
        if downward:
            raise InvalidValue(
                f"end_lr={end_lr!r} is not above the start LR {downward[0]!r} (start_lr, or the optimizer's LR "
                "when start_lr is None): the range test climbs from a small LR to a large one; pass a start_lr "
                "below end_lr"
            )
        self.tracker = LossTracker(smooth_f, diverge_th)
        if val_average is None:
            val_average = "seen" if replicas.size > 1 else "dataset"
        if val_average not in VAL_AVERAGES:
            raise InvalidValue(
                f"val_average must be 'dataset' (torch-lr-finder's: divide by len(val_loader.dataset)) or "
                f"'seen' (divide by the samples the loader yielded), got {val_average!r}"
            )
        self.validate, self.val_average = validate, val_average
        self.replicas = replicas
        self.progress_bar = progress_bar
        self.iteration = 0
        self.trainer: Trainer | None = None  # while running
        self._progress = None

    @property
    def done(self) -> bool:
        """Whether the test is over: every LR tried, or stopped by the loss."""
        return self.iteration == self.num_iter or self.tracker.stop_reason is not None

    def run(self, trainer: Trainer) -> None:
        """The whole test, for an adapter that trains one update on demand. An update the
        framework skipped (``train_update()`` returned None) is made again, uncounted; more than
        :data:`MAX_SKIPPED` in a row stop the test with :class:`TrainingFailed`."""
        with self.running(trainer):
            skipped = 0
            while not self.done:
                self.begin_update()
                loss = self.trainer.train_update()
                if self.replicas.size > 1:  # a replica's skip is every replica's (their gradients are summed)
                    loss = None if self.replicas.sum([loss is None])[0] else loss
                if loss is not None:
                    skipped = 0
                    self.end_update(loss)
                    continue
                skipped += 1
                if skipped > MAX_SKIPPED:
                    raise TrainingFailed(
                        f"{MAX_SKIPPED} updates in a row at lr={self._lrs[0][self.iteration]:.4g} were skipped for "
                        "inf/NaN gradients although their losses were finite: the gradients are not finite at any "
                        "loss scale; check the model and the loss (or run the test without mixed precision)")

    @contextlib.contextmanager
    def running(self, trainer: Trainer) -> Iterator[RangeTest]:
        """Run the test with ``trainer``: agree on the master's start LRs and open the progress
        bar; afterwards put every group's LR back (also after an error) and say it finished."""
        self.trainer = trainer
        lrs_before = trainer.lrs()
        agreed = self.replicas.broadcast(self.start_lrs)
        if agreed != self.start_lrs:
            self.start_lrs, self._lrs = agreed, [lr_sequence(start, *self._sweep) for start in agreed]
        self._progress = tqdm(total=self.num_iter, disable=not (self.progress_bar and self.replicas.is_master))
        try:
            yield self
        finally:
            trainer.set_lrs(lrs_before)
            self._progress.close()
            self.trainer = self._progress = None
        self._say("Learning rate search finished. See the graph with plot()")

    def begin_update(self) -> None:
        """Set every group's LR for the next update."""
        self.trainer.set_lrs([lrs[self.iteration] for lrs in self._lrs])

    def end_update(self, loss: float) -> bool:
        """Record the update begun last, whose training loss on this replica was ``loss``;
        return whether the test is over."""
        loss = self._validation_loss() if self.validate else self.replicas.sum([loss])[0] / self.replicas.size
        self.results.history["lr"].append(self._lrs[0][self.iteration])
        self.results.history["loss"].append(self.tracker.update(loss))
        self.results.best_loss = self.tracker.best
        self.iteration += 1
        self._progress.update()
        if self.tracker.stop_reason:
            self._say(f"Stopping early, {self.tracker.stop_reason}")
        return self.done

    def _validation_loss(self) -> float:
        loss_sum, samples = self.replicas.sum(self.trainer.evaluate())
        if not samples:
            raise InvalidValue(self.trainer.empty_validation)
        return loss_sum / (samples if self.val_average == "seen" else self.trainer.val_dataset_size())

    def _say(self, message: str) -> None:
        if self.replicas.is_master:
            print(message)
