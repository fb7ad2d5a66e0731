"""Elastic training: ``aikit.elastic.Torch.init(...)`` or ``aikit.elastic.TF.init(...)``.

After either ``init``, the plan's attributes (``steps``, ``batch_size``, ``global_batch_size``,
``gpus``, ``master``) can also be read here, as Run:AI's AIkit Elastic writes them
(``aikit.elastic.batch_size``); after the Keras ``init`` under Horovod, ``hvd`` too.
"""

from __future__ import annotations

import types

from aikit.core.plan import Plan

PUBLIC = ("steps", "batch_size", "global_batch_size", "gpus", "master")
_latest: Plan | None = None


def publish(plan: Plan, module: types.ModuleType) -> None:
    """Expose a plan's attributes on a backend module (and on ``aikit.elastic``)."""
    global _latest
    _latest = plan
    module.plan = plan
    for name in PUBLIC:
        setattr(module, name, getattr(plan, name))


def __getattr__(name: str):
    if name in PUBLIC:
        if _latest is None:
            raise AttributeError(
                f"aikit.elastic.{name} is set by init(): call aikit.elastic.Torch.init(...) "
                "or aikit.elastic.TF.init(...) first"
            )
        return getattr(_latest, name)
    raise AttributeError(f"module 'aikit.elastic' has no attribute {name!r}")
