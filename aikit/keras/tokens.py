"""A per-token mean loss for Keras ``fit`` whose micro-batch weight reaches aikit's GA optimizer.

A language model's loss is a mean over its micro-batch's tokens whose label is not ignored (or
over their sample weights). Keras' ``fit`` hands the optimizer only the gradients, so the
optimizer cannot weigh micro-batches by their tokens, and Keras' own
``gradient_accumulation_steps`` averages the micro-batch gradients: the mean of micro-batch
means, (x₁/n₁ + x₂/n₂)/2 instead of (x₁ + x₂)/(n₁ + n₂) (torchtune #1875). :class:`TokenMean`
computes the per-token mean and declares its weight, the tokens it is a mean over, to the GA
optimizer (:meth:`aikit.keras.optimizers.Optimizer.declare_weight`), which then accumulates
Σ nᵢ·gᵢ and divides by Σ nᵢ over every micro-step and replica at the update
(:mod:`aikit.core.ga`'s one weighting model). In a custom loop, pass the count to
``optimizer.apply(grads, variables, weight=n)`` instead.
"""

from __future__ import annotations

from collections.abc import Callable

from aikit.core.errors import InvalidType
from aikit.keras.optimizers import Optimizer
from aikit.runtime.Keras.backend import keras, ops, seam


class TokenMean(keras.losses.Loss):
    """The mean of ``loss`` over the tokens whose label is not ``ignore_class`` (weighted by
    ``sample_weight`` where ``fit`` passes one), declared to ``optimizer`` as the micro-batch's
    weight: the sum of the weights of the tokens it is a mean over.

    Args:
        optimizer: the aikit GA optimizer the model is compiled with.
        loss: a per-element Keras loss function (default: sparse categorical cross-entropy).
        ignore_class: the label of tokens that are no loss term (padding, prompts); None: none.
        **loss_kwargs: for ``loss`` (``from_logits=True`` for a model that returns logits).
    """

    def __init__(self, optimizer: Optimizer, loss: Callable = keras.losses.sparse_categorical_crossentropy,
                 ignore_class: int | None = -100, name: str = "token_mean", **loss_kwargs) -> None:
        if not isinstance(optimizer, Optimizer):
            raise InvalidType(
                f"TokenMean declares each micro-batch's tokens to aikit's GA optimizer, got "
                f"{type(optimizer).__name__}: pass the aikit.keras.Optimizer you compile the model with"
            )
        super().__init__(name=name, reduction="none")
        self.optimizer, self.loss, self.ignore_class, self.loss_kwargs = optimizer, loss, ignore_class, loss_kwargs

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_true = ops.convert_to_tensor(y_true)
        dtype = "float64" if keras.backend.standardize_dtype(y_pred.dtype) == "float64" else "float32"
        scored = ops.ones(ops.shape(y_true), dtype)
        if self.ignore_class is not None:
            ignored = ops.equal(y_true, self.ignore_class)
            scored = ops.where(ignored, ops.zeros_like(scored), scored)
            y_true = ops.where(ignored, ops.zeros_like(y_true), y_true)
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, dtype)
            while len(sample_weight.shape) < len(scored.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            scored = scored * sample_weight
        values = ops.cast(self.loss(y_true, y_pred, **self.loss_kwargs), dtype)
        terms = ops.sum(scored)
        self.optimizer.declare_weight(terms)
        mean = ops.divide_no_nan(ops.sum(values * scored), terms)
        replicas = seam.replicas()
        return mean if replicas == 1 else mean / replicas  # scaled for distribution, as Keras' losses are

    def get_config(self) -> dict:
        raise InvalidType("TokenMean holds its optimizer and is not saved with the model: compile the loaded model "
                          "with a new TokenMean(optimizer)")
