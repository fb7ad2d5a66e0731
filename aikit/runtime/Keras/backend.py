"""Keras on the backend it was loaded with, and that backend's seam.

Keras picks its backend once per process, when it is first imported (``KERAS_BACKEND``, or
``~/.keras/keras.json``); aikit sets none. The Keras adapter is written once, on ``keras.ops`` and
Keras variables; what differs between backends (distribution, host reads, the compiled step's
control flow) is one module per backend that provides :class:`Seam`, named in :data:`SEAMS` and
loaded here as :data:`seam`; the adapter asks the seam's members and flags, never the backend's
name. A new backend is its module and its line in :data:`SEAMS` (``tests/keras/test_seams.py``
checks that every module provides the whole protocol). A backend switched afterwards
(``keras.config.set_backend``) would leave aikit's classes on the old one: :func:`check_backend`
refuses that where users call in.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import keras

from aikit.core.errors import InvalidState

SEAMS = {  # Keras' backend -> the module of its seam
    "tensorflow": "aikit.runtime.Keras.tensorflow",
    "jax": "aikit.runtime.Keras.jax",
    "torch": "aikit.runtime.Keras.torch",
}


class Seam(Protocol):
    """What a backend's seam module provides (its functions take the arguments below, without ``self``)."""

    INT_MAX: int
    """The largest GA step count an integer variable holds (int32 on JAX without x64)."""
    PER_REPLICA_DECLARATION: bool
    """A loss declares its micro-batch's weight into a per-replica variable (``tf.distribute``'s
    ``ON_READ``), rather than handing it to ``apply`` inside the same step."""
    UPDATE_ALL_REDUCES: bool
    """The wrapped Keras optimizer all-reduces the replicas' gradients in its update (TensorFlow's
    ``_all_reduce_sum_gradients``): what the update measures can ride that all-reduce."""
    STRATEGIES: ModuleType | None
    """``tf.distribute``'s strategies (:mod:`aikit.runtime.Keras.strategies`), where the backend has them."""
    HOROVOD: bool
    """Horovod's ops train this backend's variables (``horovod.tensorflow``)."""

    # the GA update (aikit.keras.optimizers)
    def replicas(self) -> int:
        """Replicas that hand ``apply`` their gradients apart (Keras sums them in its all-reduce)."""

    def replicas_sum(self, value: Any) -> Any:
        """``value`` summed over those replicas, from a replica's context."""

    def cond(self, pred: Any, true_fn: Callable, false_fn: Callable, variables: list) -> Any:
        """The result of the branch ``pred`` picks, whose assignments to ``variables`` hold."""

    def window_ends(self, accumulated: Any, micro_steps: Any) -> Any:
        """Whether this micro-step ends the update (in the graph, or on the host)."""

    def advance(self, accumulated: Any, is_update: Any) -> None:
        """Count the micro-step: ``accumulated`` back to 0 after an update, else one more."""

    def eager(self, value: Any) -> bool:
        """Whether ``apply`` runs where Python may read, warn and raise (``value``: one of its tensors)."""

    def check_apply_context(self, built: bool) -> None:
        """Refuse an ``apply`` the backend cannot run here."""

    def merged_update(self, optimizer: Any, sums: list, variables: list) -> bool:
        """Take ``optimizer``'s update across the replicas in one cross-replica call where the
        backend needs one (a ``tf.distribute`` ``merge_call``); False where the replica takes it."""

    def add_to(self, optimizer: Any, totals: list, values: list) -> None:
        """Add each of ``values`` to its GA total, in place (:mod:`aikit.runtime.Keras.sums`)."""

    def divided(self, totals: list, divisor: Any) -> list:
        """The totals over ``divisor``: the update's gradients."""

    def clear(self, totals: list) -> None:
        """Set every total to zero."""

    def nonfinite(self, totals: list) -> Any:
        """Nonzero when any of ``totals`` holds an inf or NaN (what a reduction over replicas sums)."""

    def computes_float64(self) -> bool:
        """Whether a float64 variable computes in float64 (JAX without x64 does not)."""

    def read_variable(self, variable: keras.Variable) -> Any:
        """A variable's value on the host, as NumPy."""

    # distribution (aikit.keras.elastic)
    def found_devices(self, strategy: Any) -> tuple[int, str, int, dict]:
        """(devices a plan may use, what holds them, this process's rank, what :meth:`distribute` narrows)."""

    def distribute(self, found: dict, devices: int, global_batch: int) -> dict:
        """What ``init`` publishes beside a plan of ``devices`` (the strategy, the distribution)."""

    def describe(self, published: dict) -> str:
        """That placement, in words."""

    def placement(self, strategy: Any, published: dict) -> Any:
        """Where a wrapped model trains: ``strategy``, or the published one, or the current one."""

    def scope(self, placement: Any) -> Any:
        """The context a model and its optimizer are built and trained in, there."""

    def placed(self, model: Any, placement: Any) -> Any:
        """``model``, or a copy with its weights whose variables live in ``placement``."""

    def fresh_optimizer(self, optimizer: Any, placement: Any) -> Any:
        """``optimizer``, made again in ``placement`` when it was made outside it (still empty)."""

    def check_placed(self, keras_model: Any, user: str) -> None:
        """Refuse a model whose variables do not live where it trains."""

    def model_replicas(self, keras_model: Any) -> int:
        """The replicas or devices a compiled model's batch is split over."""

    def feeding_devices(self, plan: Any) -> int:
        """The devices this process feeds a micro-batch each per micro-step."""

    def check_batches(self, keras_model: Any, samples: int, step_batch: int) -> None:
        """Refuse data whose last batch the backend cannot split."""

    def train_micro_step(self, keras_model: Any, x: Any, y: Any, rows: list) -> float:
        """One micro-step in which replica ``r`` trains on samples ``rows[r]``; the loss."""

    def parts_per_micro_step(self, keras_model: Any) -> int:
        """Gradients a micro-step hands the optimizer apart (its noise's parts)."""

    def chief_decides(self, keras_model: Any, decide: Callable[[], Any], size: int) -> list[float]:
        """``decide()``'s ``size`` numbers from the chief, on every process."""

    # the LR finder's own loop (aikit.keras.lr_finder)
    def batches(self, data: Any, name: str, batch_size: int, shuffle: bool, repeat: bool = False) -> Any:
        """``data`` (named ``name`` in errors) in batches the finder's loop iterates."""

    def compiled(self, function: Callable) -> Callable:
        """``function`` as the backend runs a step fast."""

    def gradient_function(self, model: Any, loss_of: Callable) -> Callable:
        """``(x, y, sample_weight, divisor, scale_loss) -> (gradients, loss / divisor)`` of
        ``model``'s trainable variables; ``loss_of(x, y, sample_weight, training)``."""

    def model_scope(self, model: Any) -> Any:
        """Where ``model``'s state is made."""


BACKEND = keras.backend.backend()
if BACKEND not in SEAMS:
    raise InvalidState(
        f"aikit's Keras adapter trains on Keras' backends {', '.join(SEAMS)}, but Keras runs on {BACKEND!r}: "
        "set KERAS_BACKEND to one of those before importing keras"
    )
seam: Seam = importlib.import_module(SEAMS[BACKEND])

ops = keras.ops

__all__ = ["BACKEND", "SEAMS", "Seam", "check_backend", "keras", "ops", "seam", "to_numpy"]


def check_backend(user: str) -> None:
    """Refuse a Keras whose backend changed since aikit's Keras adapter was imported."""
    now = sys.modules.get("keras")
    if now is not keras and now is not None and now.backend.backend() != BACKEND:
        raise InvalidState(
            f"{user}: aikit's Keras adapter was imported with Keras on {BACKEND!r}, but Keras now runs on "
            f"{now.backend.backend()!r} (keras.config.set_backend reloads Keras, not aikit): Keras picks one backend "
            "per process, so set KERAS_BACKEND before importing keras and aikit, and run another backend in another "
            "process"
        )


def to_numpy(value):
    """A tensor or variable's value on the host (a read: between updates, never inside a step)."""
    return seam.read_variable(value) if isinstance(value, keras.Variable) else keras.ops.convert_to_numpy(value)
