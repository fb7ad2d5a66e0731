"""Checks that a saved optimizer state fits the optimizer it is loaded into, made before anything
changes (torch checks the groups too, but only once it is loading, and it takes hyper-parameters
and state as they come: an Adam state loads into SGD, a NaN LR or a momentum buffer of another
shape fails steps later, or never), so a failed load changes nothing.

What is checked: the groups' sizes; that each group has the hyper-parameters of the optimizer's
class (its ``defaults``: Adam's state into SGD lacks ``momentum``; keys an LR scheduler adds,
such as ``initial_lr``, may be on either side) and the kind of each value (a number, finite;
a flag; a string; a tuple of them); the state's parameter ids; every state tensor's shape against
its parameter's. For ``torch.optim``'s own classes the shapes are known (the parameter's, a scalar
for ``step``, Adafactor's factored ``row_var``/``col_var``); for other optimizers a state tensor
is checked against the state the optimizer already holds for that parameter, when it holds one.
A state tensor may be anything with ``shape`` (a sharded checkpoint's stand-in for a DTensor).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch

from aikit.core.errors import InvalidValue

_SCALAR_STATE = {"step", "eta", "mu", "mu_product"}  # torch.optim's per-parameter scalars


def check_groups(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Refuse a torch optimizer state that does not fit ``optimizer``: its groups' sizes and
    hyper-parameters, its state's parameter ids and tensor shapes (see the module's docstring)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) \
            or not isinstance(saved.get("state"), dict):
        raise InvalidValue("the checkpoint's optimizer entry is not a torch optimizer state_dict")
    groups = saved["param_groups"]
    if not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise InvalidValue("the checkpoint's optimizer entry is not a torch optimizer state_dict (a group without "
                           "a list of params)")
    have = [len(g["params"]) for g in optimizer.param_groups]
    got = [len(g["params"]) for g in groups]
    if have != got:
        raise InvalidValue(
            f"the checkpoint's optimizer has parameter groups of sizes {got}, this one {have}: build the "
            "optimizer over the same parameters as the run that saved it"
        )
    name, defaults = type(optimizer).__name__, set(optimizer.defaults)
    for index, (group, saved_group) in enumerate(zip(optimizer.param_groups, groups, strict=True)):
        missing = sorted(defaults - set(saved_group))
        if missing:
            raise InvalidValue(
                f"the checkpoint's optimizer lacks the hyper-parameters {missing} of a {name} in group {index} (it "
                f"has {sorted(set(saved_group) - {'params'})}): it was saved by another kind of optimizer; load a "
                f"{name}'s state into a {name}"
            )
        for key in sorted(set(group) & set(saved_group) - {"params"}):  # schedulers add keys (initial_lr)
            _check_setting(f"{key} in group {index}", group[key], saved_group[key], name)
    _check_state(optimizer, groups, saved["state"])


def _check_setting(what: str, now: Any, saved: Any, name: str) -> None:
    """``saved`` must be the same kind of value as ``now``: a bool for a bool (None for either),
    a finite number for a number, a string for a string, a tuple of such for a tuple."""
    problem = None
    if now is None or isinstance(now, bool):
        if saved is not None and not isinstance(saved, bool):
            problem = "True, False or None"
    elif isinstance(now, Real | torch.Tensor):
        number = saved.item() if isinstance(saved, torch.Tensor) and saved.numel() == 1 else saved
        if isinstance(number, bool) or not isinstance(number, Real):
            problem = "a number"
        elif not math.isfinite(number):
            problem = "a finite number"
    elif isinstance(now, str):
        if not isinstance(saved, str):
            problem = "a string"
    elif isinstance(now, tuple | list):
        if not isinstance(saved, tuple | list) or len(saved) != len(now):
            problem = f"a sequence of {len(now)}"
        else:
            for position, (a, b) in enumerate(zip(now, saved, strict=True)):
                _check_setting(f"{what}[{position}]", a, b, name)
    if problem is not None:
        raise InvalidValue(f"the checkpoint's optimizer has {what} = {saved!r:.60}, where this {name} has "
                           f"{now!r:.60}: it must be {problem}; restore an intact commit (was the state edited?)")


def _check_state(optimizer: torch.optim.Optimizer, groups: list[dict], state: dict) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ids = [i for group in groups for i in group["params"]]
    where = {i: position for position, i in enumerate(ids)}
    if len(where) != len(ids):
        raise InvalidValue("the checkpoint's optimizer lists a parameter id twice in its groups")
    known = type(optimizer).__module__.startswith("torch.optim")
    for key, values in state.items():
        if key not in where:
            raise InvalidValue(f"the checkpoint's optimizer holds state for parameter id {key!r:.40}, which none of "
                               f"its groups lists ({len(ids)} ids)")
        if not isinstance(values, dict):
            raise InvalidValue(f"the checkpoint's optimizer state of parameter {key} is a "
                               f"{type(values).__name__}, not a dict")
        param = params[where[key]]
        holds = optimizer.state.get(param, {})
        for name, value in values.items():
            _check_state_value(f"state {name!r} of parameter {key}", name, value, param, holds.get(name), known)


def _check_state_value(what: str, name: str, value: Any, param: torch.Tensor, held: Any, known: bool) -> None:
    shape = getattr(value, "shape", None)
    if shape is None:
        if isinstance(value, Real) and not isinstance(value, bool) and not math.isfinite(value):
            raise InvalidValue(f"the checkpoint's optimizer has {what} = {value!r}: not a finite number")
        return
    shape = tuple(shape)
    if known:
        wanted = _torch_state_shape(name, tuple(param.shape))
    else:
        wanted = tuple(held.shape) if hasattr(held, "shape") else None
    if wanted is not None and shape != wanted:
        raise InvalidValue(
            f"the checkpoint's optimizer has {what} of shape {shape}, where its parameter has shape "
            f"{tuple(param.shape)} (the state needs {wanted}): resume with the model and optimizer that saved it"
        )


def _torch_state_shape(name: str, param: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``torch.optim``'s classes give state ``name`` of a parameter of shape ``param``."""
    if name in _SCALAR_STATE:
        return ()
    if name == "row_var" and len(param) >= 2:  # Adafactor's factored second moment
        return (*param[:-1], 1)
    if name == "col_var" and len(param) >= 2:
        return (*param[:-2], 1, param[-1])
    return param


def check_pending(params: list[torch.Tensor], pending: list[Any]) -> None:
    """Refuse pending gradients (accumulated mid-update) that do not fit ``params``."""
    if not isinstance(pending, list):
        raise InvalidValue(f"the checkpoint's pending gradients are a {type(pending).__name__}, not a list")
    if len(pending) != len(params):
        raise InvalidValue(f"the checkpoint holds {len(pending)} pending gradients for {len(params)} parameters")
    for index, (p, grad) in enumerate(zip(params, pending, strict=True)):
        if grad is not None and tuple(grad.shape) != tuple(p.shape):
            raise InvalidValue(
                f"the checkpoint's pending gradient {index} has shape {tuple(grad.shape)}, its parameter "
                f"{tuple(p.shape)}: resume with the model that saved it"
            )
