"""Batch iterators for the range test, as torch-lr-finder 0.2.2 defines them.

Subclass ``TrainDataLoaderIter`` or ``ValDataLoaderIter`` and override
``inputs_labels_from_batch`` when a loader yields something other than ``(inputs, labels, ...)``
(a dict, say). A criterion that does not fit the batches fails with their shapes
(:func:`criterion_failed`).
"""

from __future__ import annotations

from aikit.core.errors import InvalidType, InvalidValue

_EMPTY = object()


class DataLoaderIter:
    """Wraps a ``DataLoader`` and turns each batch into ``(inputs, labels)``."""

    def __init__(self, data_loader):
        self.data_loader = data_loader
        self._iterator = iter(data_loader)

    @property
    def dataset(self):
        return self.data_loader.dataset

    def inputs_labels_from_batch(self, batch_data):
        """``(inputs, labels)`` from a tuple or list batch; override this for other batches."""
        if not isinstance(batch_data, (list, tuple)):
            raise InvalidType(
                f"Your batch type is not supported: {type(batch_data)}. Please inherit from "
                "`TrainDataLoaderIter` or `ValDataLoaderIter` and override the "
                "`inputs_labels_from_batch` method."
            )
        inputs, labels, *_ = batch_data
        return inputs, labels

    def __iter__(self):
        return self

    def __next__(self):
        return self.inputs_labels_from_batch(next(self._iterator))


class TrainDataLoaderIter(DataLoaderIter):
    """Never runs dry: with ``auto_reset`` it starts the loader again (a new epoch) when it ends."""

    def __init__(self, data_loader, auto_reset: bool = True):
        super().__init__(data_loader)
        self.auto_reset = auto_reset

    def __next__(self):
        try:
            batch = next(self._iterator)
        except StopIteration:
            if not self.auto_reset:
                raise
            self._iterator = iter(self.data_loader)
            batch = next(self._iterator, _EMPTY)
            if batch is _EMPTY:
                raise InvalidValue("train_loader yields no batches: give the range test data to train on") from None
        return self.inputs_labels_from_batch(batch)


class ValDataLoaderIter(DataLoaderIter):
    """One pass per ``for`` loop: it starts again only through ``iter()``, like a DataLoader,
    once ``len(data_loader)`` batches have been read."""

    def __init__(self, data_loader):
        super().__init__(data_loader)
        self.run_limit = len(self.data_loader)
        self.run_counter = 0

    def __iter__(self):
        if self.run_counter >= self.run_limit:
            self._iterator = iter(self.data_loader)
            self.run_counter = 0
        return self

    def __next__(self):
        self.run_counter += 1
        return super().__next__()


def criterion_failed(error: Exception, outputs, labels) -> InvalidValue:
    """The aikit error for ``error``, the criterion's on the first batch: its words first (the
    caller chains it), then what failed, on what shapes, and which criterion fits."""
    return InvalidValue(
        f"{error}\n(aikit LRFinder: the criterion failed on the range test's first batch: "
        f"criterion(model(inputs), labels) got outputs of {shapes(outputs)} and labels of {shapes(labels)}; "
        "give a criterion that takes the model's outputs and the loader's labels as they are, e.g. "
        "nn.CrossEntropyLoss() for class indices of shape (N,) and outputs (N, classes), nn.MSELoss() for "
        "targets of the outputs' shape)")


def shapes(obj) -> str:
    """What a batch holds, as its shapes say it: ``shape (8, 2)``, ``[shape (8, 2), shape (8,)]``."""
    if hasattr(obj, "shape"):  # a tensor of any framework
        return f"shape {tuple(obj.shape)}"
    if isinstance(obj, (tuple, list)):
        return "[" + ", ".join(shapes(o) for o in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {shapes(o)}" for k, o in obj.items()) + "}"
    return f"a {type(obj).__name__}"
