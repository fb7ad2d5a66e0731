"""The errors aikit raises for bad input and failed file operations: one vocabulary for every module.

Each is a subclass of :class:`AikitError` and of the built-in exception a Python user already
catches for that kind of fault, so ``except ValueError`` keeps working and ``except AikitError``
tells an aikit refusal (with the value and the fix in its message) from a bug's traceback.
A wrong type is both a ``TypeError`` and a ``ValueError``, as NumPy's ``AxisError`` is both a
``ValueError`` and an ``IndexError``: code that caught the ``ValueError`` aikit raised before
types were checked keeps working.

The warnings of training that goes on but not as the user meant are here too
(:class:`NonFiniteGradientWarning`, :class:`NoGradientWarning`), each a ``RuntimeWarning``.
"""

from __future__ import annotations


class AikitError(Exception):
    """Base of every error aikit raises on purpose."""

    # Exception's own __init__ (not ValueError's or TypeError's): TensorFlow re-raises an error from
    # traced code as its own type only then, so an InvalidValue raised inside a tf.function stays one
    # rather than becoming a StagingError, which is no ValueError.
    __init__ = Exception.__init__


class InvalidValue(AikitError, ValueError):
    """An argument or a file entry with a value aikit cannot use; the message names it and the fix."""


class InvalidType(AikitError, TypeError, ValueError):
    """An argument of the wrong type (``dataset_size='100'``, ``seed=1.7``); the message names it."""


class InvalidState(AikitError, RuntimeError):
    """A call the program is not ready for (``init()`` not called yet, ``step()`` before
    ``set_epoch()``, a process group not initialised, Keras on another backend); the message names
    what to do first. A ``RuntimeError``, as these refusals were before they had a name."""


class TraceFileError(InvalidValue):
    """A trace file that cannot be read as ``step,batchsize`` CSV; the message names the file and line."""


class CheckpointError(InvalidValue):
    """A checkpoint file that cannot be trusted (corrupt, truncated, not aikit's); names the file and why."""


class CommitError(AikitError, OSError):
    """A commit that could not be written (disk full, read-only, ...); nothing was changed by it."""


class CollectiveError(AikitError, RuntimeError):
    """A collective (all-reduce, broadcast) that failed because a peer is gone or cannot be reached:
    names the collective, the rank, the time it waited and the timeout that bounds the wait."""


class UpdateAborted(CollectiveError):
    """An update whose sum over the replicas failed where every update has its own quorum (TorchFT:
    a replica group lost or silent in the middle of it): nothing was applied, and the loop trains
    the same update again on the same samples, dealt to the replicas of the next quorum."""


class TrainingFailed(AikitError, RuntimeError):
    """Training that cannot go on as asked: a loss that stays NaN/inf through every rollback, a
    validation function that never gives a finite number, updates skipped for a non-finite
    gradient ``max_skips_in_a_row`` times in a row; the message says what was seen and the fix."""


class NonFiniteGradientWarning(RuntimeWarning):
    """An update skipped because its gradient was not finite (inf or NaN), as a GradScaler skips
    one: no weight changed. Warned once per optimizer; the message says what to check."""


class SmallSplitWarning(UserWarning):
    """A global batch whose even splits force a per-device batch far below the one asked for (a
    prime global batch: one sample per device per GA step), kept but slow; the message gives the
    nearest global batches that split."""


class NoGradientWarning(RuntimeWarning):
    """An update with no gradient at all, or one of whose micro-steps had no backward: the
    update changed nothing, or is the mean over micro-steps of which some gave nothing (a
    forgotten ``backward()``). Warned once per optimizer."""


class NoFloat64Warning(UserWarning):
    """float64 asked for (Keras' ``floatx``, a variable's dtype) on a backend that computes it in
    float32 without a word of its own: Keras on JAX without ``jax_enable_x64``. The message says
    how to turn float64 on."""


class OutOfMemory(AikitError, MemoryError):
    """No per-device batch fits: an ``auto`` search (``init(G, "auto", trial=...)``) whose
    smallest micro-batch ran out of memory too, or an out-of-memory error ``AutoBatch`` cannot
    re-plan; the message says what the allocator tried, the memory there was, and the fix."""


def repeats_on_restart(error: BaseException) -> bool:
    """Whether ``error`` is one a restart from the last commit meets again, the same input giving
    the same refusal: bad input or state (:class:`InvalidValue`, :class:`InvalidType`,
    :class:`InvalidState`, their kinds: a trace file, a checkpoint) and training that cannot go on
    (:class:`TrainingFailed`); not a peer lost (:class:`CollectiveError`), a commit not written
    (:class:`CommitError`) or memory (:class:`OutOfMemory`), which another world may not meet. What
    an elastic engine that restarts on every failure (Ray Train) should not retry."""
    return isinstance(error, (InvalidValue, InvalidType, InvalidState, TrainingFailed))
