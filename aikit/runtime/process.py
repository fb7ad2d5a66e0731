"""What this process remembers between calls: the one home of aikit's process state.

Run:AI's AIkit Elastic publishes a plan on the module that made it (``aikit.elastic.Torch.steps``,
...), eth-easl's optimizers take the sampler made last when given none, and on JAX ``init`` may
set a ``keras.distribution`` of its own. Each is state that outlives the call that made it, so it
lives here, in one :class:`ProcessState`, and only this module's functions write it (or a module's
attributes): every other module of aikit is stateless between calls. Each framework reads only
what its own ``init`` published (:func:`plan_of`); ``aikit.elastic`` serves the latest of either,
as Run:AI's users read it (:func:`latest`). Framework-free: importing this module loads no framework.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

from aikit.core.plan import Plan

PUBLIC = ("steps", "batch_size", "global_batch_size", "gpus", "master")
TORCH, KERAS = "aikit.elastic.Torch", "aikit.keras.elastic"  # the packages whose init() publishes


@dataclass
class ProcessState:
    """Everything aikit keeps between calls in this process."""

    publishers: dict[str, types.ModuleType] = field(default_factory=dict)  # the packages whose init() published
    extras_on: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the extras each one's last init() set
    latest: tuple[Plan, dict[str, Any]] | None = None  # the last init()'s plan and extras, of either framework
    sampler_made_last: Any = None  # eth-easl's CustomSampler made last: its optimizers' default
    keras_distribution: Any = None  # the keras.distribution an init set itself (JAX), told from the program's


_state = ProcessState()


def publish(plan: Plan, module: types.ModuleType, **extras: Any) -> None:
    """Set ``plan``, its :data:`PUBLIC` attributes and ``extras`` (Keras' ``strategy`` or
    ``distribution``, ``hvd`` under Horovod, torch's ``search``) on ``module``, the package whose
    ``init`` planned it, and remember them as its framework's and as the latest of either. An extra
    the package's previous ``init`` set and this one does not give is removed (``hvd`` exists only
    under Horovod). The one place a module's attributes are written."""
    name = module.__name__
    _state.latest = (plan, dict(extras))
    _state.publishers[name] = module
    for stale in set(_state.extras_on.get(name, ())) - set(extras):
        module.__dict__.pop(stale, None)
    _state.extras_on[name] = tuple(extras)
    module.plan = plan
    for attribute in PUBLIC:
        setattr(module, attribute, getattr(plan, attribute))
    for attribute, value in extras.items():
        setattr(module, attribute, value)


def published(module: str, name: str = "plan") -> Any:
    """What the package named ``module`` published as ``name`` (its ``"plan"``, or an extra such as
    ``"strategy"``), read from the package as its users read it; None before its first ``init()``."""
    publisher = _state.publishers.get(module)
    return None if publisher is None else getattr(publisher, name, None)


def plan_of(module: str) -> Plan | None:
    """The plan the ``init`` of package ``module`` (:data:`TORCH` or :data:`KERAS`) published last."""
    return published(module)


def latest() -> tuple[Plan, dict[str, Any]] | None:
    """The last ``init()``'s plan and extras, of either framework (what ``aikit.elastic`` serves)."""
    return _state.latest


def remember_sampler(sampler: Any) -> None:
    """Note eth-easl's ``CustomSampler`` made last (its optimizers take it when given none)."""
    _state.sampler_made_last = sampler


def sampler_made_last() -> Any:
    return _state.sampler_made_last


def remember_distribution(distribution: Any) -> None:
    """Note the ``keras.distribution`` an ``init`` set itself (JAX), so a later ``init`` tells it
    from one the program set."""
    _state.keras_distribution = distribution


def distribution_set_by_aikit() -> Any:
    return _state.keras_distribution
