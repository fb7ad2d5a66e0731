"""A micro-step's factor applied where its gradient enters the model: at the model's outputs.

``accumulate(model, weight=n)`` must make micro-batch i's gradient enter the update's sum as
nᵢ·gᵢ. torchtune multiplies its loss by nᵢ (#1917); a wrapper does not see the loss, so
:class:`OutputWeights` multiplies the gradient the loss sends into the model's outputs: a forward
hook on the model passes every output tensor that requires a gradient through an identity whose
backward multiplies by a *factor* (the count nᵢ, or a sample share under FSDP2; exactly zero
for a factor of 0: a micro-batch without terms,
whose mean loss is NaN, adds nothing). By the chain rule every parameter's gradient is then
weighed once, whichever way the outputs were computed from each other inside the model.

Why there and not in ``.grad``: one multiply of the outputs' gradient per micro-step (a scalar
where the model returns its loss, as Hugging Face models do), no Python per parameter, no host
sync for a factor that is a tensor on the device; and it reaches the gradients wherever they
accumulate: DDP's all-reduced buckets, FSDP2's unsharded gradients between reduce-scatters.
The limit: a loss term that reaches the parameters other than through ``model``'s outputs (a
penalty on the weights added to the loss) is not weighed.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from aikit.core.errors import InvalidValue


class _Weigh(torch.autograd.Function):
    """The identity, whose backward multiplies the gradient by a factor."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, factor: Any) -> torch.Tensor:
        ctx.factor = factor
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return weigh(grad, ctx.factor), None


def weigh(grad: torch.Tensor, factor: Any) -> torch.Tensor:
    """``grad`` times ``factor`` (a number, or a 0-d tensor on ``grad``'s device), exactly zero
    where the factor is 0 even if ``grad`` is NaN (the mean over no terms)."""
    if isinstance(factor, torch.Tensor):
        return torch.where(factor != 0, grad * factor, 0)  # no host read of the factor
    if factor == 0:
        return torch.zeros_like(grad)
    return grad if factor == 1 else grad * factor


class OutputFactors:
    """Multiplies the gradient entering the outputs of the models it hooks, while :meth:`applied`."""

    def __init__(self) -> None:
        self.factor: Any = None  # the factor of the running micro-step (None: outputs untouched)
        self.calls = 0  # forwards of the model since the factor was set
        self.weighed = 0  # output tensors weighed since then
        self._hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its forward hook

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module, factor: Any) -> Iterator[None]:
        """Multiply by ``factor`` the gradient entering the outputs of every forward of ``model``
        inside this context."""
        if model not in self._hooks:  # once per model: the hook does nothing outside this context
            self._hooks[model] = model.register_forward_hook(functools.partial(_weigh_outputs, weakref.ref(self)))
        self.factor, self.calls, self.weighed = factor, 0, 0
        try:
            yield
        finally:
            self.factor = None
        if not self.weighed:
            ran = f"ran {self.calls} time(s) but returned no tensor that requires a gradient" if self.calls else \
                "was not called"
            raise InvalidValue(
                f"accumulate(model, weight=...) weighs the gradient entering the model's outputs, but the model "
                f"({type(model).__name__}) {ran} inside the context: run the forward of the model you pass "
                "inside accumulate(), returning tensors, tuples, dicts or dataclasses of them (a Hugging Face "
                "ModelOutput)"
            )


def _weigh_outputs(ref: weakref.ref, module: torch.nn.Module, args: Any, output: Any) -> Any:
    factors = ref()
    if factors is None or factors.factor is None:
        return None
    factors.calls += 1
    factor = factors.factor

    def weighed(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.requires_grad:
            return tensor
        factors.weighed += 1
        return _Weigh.apply(tensor, factor)

    return tree_map_only(torch.Tensor, weighed, output)
