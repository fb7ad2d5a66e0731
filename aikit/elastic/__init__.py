"""Elastic training: ``aikit.elastic.Torch.init(...)`` or ``aikit.elastic.TF.init(...)``.

After either ``init``, the plan's attributes (``steps``, ``batch_size``, ``global_batch_size``,
``gpus``, ``master``) and the plan itself (``plan``) can also be read here, as Run:AI's AIkit
Elastic writes them (``aikit.elastic.batch_size``); after the Keras ``init`` also its
``strategy``, and under Horovod ``hvd``. They are those of the latest ``init``.
"""

from __future__ import annotations

import types

from aikit.core.plan import Plan

PUBLIC = ("steps", "batch_size", "global_batch_size", "gpus", "master")
_latest: Plan | None = None
_extras: dict[str, object] = {}  # what the latest init published beside its plan (Keras: its strategy)


def publish(plan: Plan, module: types.ModuleType, **extras: object) -> None:
    """Expose a plan's attributes, the plan (``plan``) and ``extras`` on a backend module, and
    make them the ones ``aikit.elastic`` answers with."""
    global _latest, _extras
    _latest, _extras = plan, dict(extras)
    module.plan = plan
    for name in PUBLIC:
        setattr(module, name, getattr(plan, name))
    for name, value in extras.items():
        setattr(module, name, value)


def __getattr__(name: str):
    if name in (*PUBLIC, "plan", "strategy"):
        if _latest is None:
            raise AttributeError(
                f"aikit.elastic.{name} is set by init(): call aikit.elastic.Torch.init(...) "
                "or aikit.elastic.TF.init(...) first"
            )
        if name == "plan":
            return _latest
        if name in PUBLIC:
            return getattr(_latest, name)
        if name in _extras:
            return _extras[name]
        raise AttributeError(
            f"aikit.elastic.{name} is set by aikit.elastic.TF.init(...); the latest init was PyTorch's"
        )
    raise AttributeError(f"module 'aikit.elastic' has no attribute {name!r}")
