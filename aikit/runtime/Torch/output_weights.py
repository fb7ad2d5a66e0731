"""A micro-step's weight applied where its gradient enters the model: at the model's outputs.

``accumulate(model, weight=n)`` must make micro-batch i's gradient enter the update's sum as
nᵢ·gᵢ. torchtune multiplies its loss by nᵢ (#1917); a wrapper does not see the loss, so
:class:`OutputWeights` multiplies the gradient the loss sends into the model's outputs: a forward
hook on the model passes every output tensor that requires a gradient through an identity whose
backward multiplies by the weight (exactly zero for a weight of 0: a micro-batch without terms,
whose mean loss is NaN, adds nothing). By the chain rule every parameter's gradient is then
weighed once, whichever way the outputs were computed from each other inside the model.

Why there and not in ``.grad``: one multiply of the outputs' gradient per micro-step (a scalar
where the model returns its loss, as Hugging Face models do), no Python per parameter, no host
sync for a weight that is a tensor on the device; and it reaches the gradients wherever they
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
    """The identity, whose backward multiplies the gradient by a weight."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, weight: Any) -> torch.Tensor:
        ctx.weight = weight
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return weigh(grad, ctx.weight), None


def weigh(grad: torch.Tensor, weight: Any) -> torch.Tensor:
    """``grad`` times ``weight`` (a number, or a 0-d tensor on ``grad``'s device), exactly zero
    where the weight is 0 even if ``grad`` is NaN (the mean over no terms)."""
    if isinstance(weight, torch.Tensor):
        return torch.where(weight != 0, grad * weight, 0)  # no host read of the weight
    if weight == 0:
        return torch.zeros_like(grad)
    return grad if weight == 1 else grad * weight


class OutputWeights:
    """Weighs the gradient entering the outputs of the models it hooks, while :meth:`applied`."""

    def __init__(self) -> None:
        self.weight: Any = None  # the weight of the running micro-step (None: outputs untouched)
        self.calls = 0  # forwards of the model since the weight was set
        self.weighed = 0  # output tensors weighed since then
        self._hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its forward hook

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module, weight: Any) -> Iterator[None]:
        """Weigh by ``weight`` the gradient entering the outputs of every forward of ``model``
        inside this context."""
        if model not in self._hooks:  # once per model: the hook does nothing outside this context
            self._hooks[model] = model.register_forward_hook(functools.partial(_weigh_outputs, weakref.ref(self)))
        self.weight, self.calls, self.weighed = weight, 0, 0
        try:
            yield
        finally:
            self.weight = None
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
    weights = ref()
    if weights is None or weights.weight is None:
        return None
    weights.calls += 1
    weight = weights.weight

    def weighed(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.requires_grad:
            return tensor
        weights.weighed += 1
        return _Weigh.apply(tensor, weight)

    return tree_map_only(torch.Tensor, weighed, output)
