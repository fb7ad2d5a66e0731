"""The plan the last ``init()`` published, kept below every layer that reads it.

``aikit.elastic.Torch.init`` and ``aikit.elastic.TF.init`` plan a run and publish the plan's
attributes on their module, as Run:AI's AIkit Elastic does (``aikit.elastic.Torch.steps``, ...).
The record lives here, under both ``aikit.elastic`` and ``aikit.ga``, so the GA wrappers read
the global batch and the Keras ``Model`` its plan and strategy without reaching into the
package that planned them. Framework-free: importing this module loads no framework.
"""

from __future__ import annotations

import types
from typing import Any

from aikit.core.plan import Plan

PUBLIC = ("steps", "batch_size", "global_batch_size", "gpus", "master")

_latest: Plan | None = None
_latest_extras: dict[str, Any] = {}  # what the latest init published beside its plan (Keras: its strategy)
_publishers: dict[str, types.ModuleType] = {}  # the packages whose init() published, by name
_extras_on: dict[str, tuple[str, ...]] = {}  # the extras each package's last init() set on it


def publish(plan: Plan, module: types.ModuleType, **extras: Any) -> None:
    """Set ``plan``, its :data:`PUBLIC` attributes and ``extras`` (Keras' ``strategy``, and ``hvd``
    under Horovod) on ``module``, the package whose ``init`` planned it, and remember the plan as
    the latest of either framework. An extra the package's previous ``init`` set and this one does
    not give is removed (``hvd`` exists only under Horovod). The one place an ``init`` writes
    attributes of a module: ``aikit.elastic`` reads the latest through :func:`latest_plan` and
    :func:`latest_extras`."""
    global _latest, _latest_extras
    _latest, _latest_extras = plan, dict(extras)
    _publishers[module.__name__] = module
    for name in set(_extras_on.get(module.__name__, ())) - set(extras):
        module.__dict__.pop(name, None)
    _extras_on[module.__name__] = tuple(extras)
    module.plan = plan
    for name in PUBLIC:
        setattr(module, name, getattr(plan, name))
    for name, value in extras.items():
        setattr(module, name, value)


def latest_plan() -> Plan | None:
    """The plan of the last ``init()`` of either framework; None before one."""
    return _latest


def latest_extras() -> dict[str, Any]:
    """What the last ``init()`` published beside its plan (``{"strategy": ...}`` after Keras')."""
    return dict(_latest_extras)


def published(module: str, name: str = "plan") -> Any:
    """What the package named ``module`` publishes as ``name`` (its ``"plan"``, or an extra such as
    ``"strategy"``), read from the package as its users read it; None before its first ``init()``."""
    publisher = _publishers.get(module)
    return None if publisher is None else getattr(publisher, name, None)
