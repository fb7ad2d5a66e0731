"""Run:AI's AIkit compatibility for the torch GA wrapper: its checkpoints and its prebuilt optimizers.

Run:AI's AIkit saved a GA optimizer as a torch optimizer's state with a ``State(steps, step)``
counter in ``state['runai']`` (:func:`from_runai` converts it), and offered one prebuilt GA
class per torch optimizer, ``Adam(steps, params, ...)`` (:func:`prebuilt_classes` makes them
over the GA wrapper, found at import, named as torch names them).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from aikit.core.errors import InvalidValue
from aikit.core.validate import non_negative_int, positive_int


def from_runai(state_dict: Any) -> Any:
    """Run:AI's AIkit's GA state_dict (a torch optimizer's, its ``State(steps, step)`` counter in
    ``state['runai']``) as the GA wrapper's; anything else as it is. Run:AI's summed the micro-batch
    gradients and did not save them, so it converts only between updates."""
    state = state_dict.get("state") if isinstance(state_dict, dict) else None
    runai = state.get("runai") if isinstance(state, dict) else None
    if not (hasattr(runai, "steps") and hasattr(runai, "step")):
        return state_dict
    steps, step = positive_int(runai.steps, "Run:AI's runai.steps"), non_negative_int(runai.step, "Run:AI's runai.step")
    if step % steps:
        raise InvalidValue(
            f"Run:AI's AIkit's state_dict was saved {step % steps} micro-steps into an update of steps={steps}, "
            "and Run:AI's AIkit does not save the gradients accumulated so far: resume from one saved between "
            "updates (runai.step a multiple of runai.steps)"
        )
    inner = {**state_dict, "state": {key: value for key, value in state.items() if key != "runai"}}
    ga = {"steps": steps, "position": 0, "micro_steps": step, "reduction": "sum", "samples": 0, "weighted": 0,
          "unit": None, "pending_grads": []}
    return {"optimizer": inner, "ga": ga}


def prebuilt_classes(base: type[torch.optim.Optimizer], module: str) -> dict[str, type[torch.optim.Optimizer]]:
    """Run:AI's prebuilt GA form of every optimizer class torch.optim exports, by name: subclasses
    of the GA wrapper ``base`` that ``module`` exports (their ``__module__``, for pickling)."""
    return {inner.__name__: _prebuilt(base, inner, module) for inner in _torch_optimizer_classes()}


def _prebuilt(base: type[torch.optim.Optimizer], inner: type[torch.optim.Optimizer],
              module: str) -> type[torch.optim.Optimizer]:
    """Run:AI's prebuilt GA form of ``inner``: ``Name(steps, *args, **kwargs)`` builds
    ``inner(*args, **kwargs)`` and wraps it in ``base``; the wrapper's own keywords are taken out first."""
    wrapper_keywords = [name for name, p in inspect.signature(base.__init__).parameters.items()
                        if p.kind is p.KEYWORD_ONLY]

    def __init__(self, steps: int, *args: Any, **kwargs: Any) -> None:
        options = {name: kwargs.pop(name) for name in wrapper_keywords if name in kwargs}
        base.__init__(self, inner(*args, **kwargs), steps, **options)

    name = inner.__name__
    __init__.__qualname__ = f"{name}.__init__"
    doc = (f"GA over ``torch.optim.{name}``: ``{name}(steps, params, ...)`` is "
           f"``Optimizer(torch.optim.{name}(params, ...), steps)``; the wrapper's keywords "
           f"({', '.join(wrapper_keywords)}) go to :class:`Optimizer`, the others to ``torch.optim.{name}``.")
    return type(name, (base,), {"__init__": __init__, "__doc__": doc, "__module__": module,
                                "__qualname__": name, "inner_class": inner})


def _torch_optimizer_classes() -> list[type[torch.optim.Optimizer]]:
    """Every optimizer class torch.optim exports, its abstract base aside (that name is the GA
    wrapper's)."""
    exported = getattr(torch.optim, "__all__", dir(torch.optim))
    return [cls for cls in (getattr(torch.optim, name, None) for name in exported)
            if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer]
