"""The GA reduction a compiled Keras loss needs: the sum of the micro-batch gradients for a loss
that sums over its samples (``reduction="sum"``), their mean for a mean loss.

A big batch's summed loss has the sum of its micro-batches' gradients; their mean would train
``1/steps`` too slowly, and a mean loss's update summed ``steps`` times too fast. Keras hands an
optimizer only gradients and variables, so :func:`building_model` finds the model whose ``fit``
builds it (Keras' trainer calls ``optimizer.build`` from a method of the model), and
:func:`compiled_reduction` reads the reduction of the losses it was compiled with.
"""

from __future__ import annotations

import sys

from aikit.core.errors import InvalidValue
from aikit.runtime.Keras.backend import keras

SUMMED = {"sum"}
AVERAGED = {"sum_over_batch_size", "mean", "mean_with_sample_weight"}  # Keras' default, and a string's or function's
FRAMES = 6  # how far up from build() Keras' trainer may be (a LossScaleOptimizer's build in between)


def _loss_name(loss) -> str:
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or repr(loss)


def _kinds(model) -> dict[str, str]:
    """The GA reductions ``model``'s compiled losses need, each with the name of a loss that needs it."""
    kinds: dict[str, str] = {}
    for loss in keras.tree.flatten(getattr(model, "loss", None)):
        if loss is None:
            continue
        reduction = loss.reduction if isinstance(loss, keras.losses.Loss) else "sum_over_batch_size"
        if reduction in SUMMED:
            kinds.setdefault("sum", _loss_name(loss))
        elif reduction in AVERAGED:
            kinds.setdefault("mean", _loss_name(loss))
    return kinds


def compiled_reduction(model) -> str | None:
    """``"sum"`` or ``"mean"``, the GA reduction the losses ``model`` was compiled with need; None
    when it has none, or only losses that reduce nothing themselves (``reduction=None`` or
    ``"none"``, as :class:`aikit.keras.TokenMean`, which weighs its micro-batches itself). Losses
    of both kinds are refused: no one reduction makes every update the big batch's."""
    kinds = _kinds(model)
    if len(kinds) > 1:
        raise InvalidValue(
            f"the model is compiled with a summed loss ({kinds['sum']!r}, reduction='sum') and a mean one "
            f"({kinds['mean']!r}): aikit's GA optimizer either sums or averages the micro-batch gradients, so no "
            "update would be the big batch's; compile every loss with one reduction"
        )
    return next(iter(kinds), None)


def mismatch(model, reduction: str) -> str | None:
    """What is wrong when ``model``'s losses need another reduction than ``reduction``, or None."""
    needed = compiled_reduction(model)
    if needed is None or needed == reduction:
        return None
    effect = "1/steps of" if needed == "sum" else "steps times"
    return (f"the model's loss {_kinds(model)[needed]!r} needs reduction={needed!r} (the {needed} of the micro-batch "
            f"gradients is the big batch's gradient), but this GA optimizer was made with reduction={reduction!r}: "
            f"every update would move {effect} the big batch's step; leave reduction out (the optimizer then takes "
            f"the compiled loss's) or pass reduction={needed!r}")


def building_model(optimizer):
    """The Keras model whose ``fit`` (``train_on_batch``, ``compile_from_config``) is building
    ``optimizer`` now: the ``self`` of a caller's frame whose optimizer it is, or None (a custom
    loop's ``apply`` or ``build``)."""
    frame = sys._getframe(2)
    for _ in range(FRAMES):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, keras.Model):
            compiled = getattr(owner, "optimizer", None)
            return owner if optimizer in (compiled, getattr(compiled, "inner_optimizer", None)) else None
        frame = frame.f_back
    return None
