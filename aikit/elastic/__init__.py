"""Elastic training: ``aikit.elastic.Torch.init(...)`` or ``aikit.elastic.TF.init(...)``.

After either ``init``, the plan's attributes (``steps``, ``batch_size``, ``global_batch_size``,
``gpus``, ``master``) and the plan itself (``plan``) can also be read here, as Run:AI's AIkit
Elastic writes them (``aikit.elastic.batch_size``); after the Keras ``init`` also its
``strategy``, and under Horovod ``hvd``. They are those of the latest ``init``, kept by
:mod:`aikit.runtime.published`.
"""

from __future__ import annotations

from aikit.runtime.published import PUBLIC, latest_extras, latest_plan


def __getattr__(name: str):
    if name in (*PUBLIC, "plan", "strategy"):
        plan = latest_plan()
        if plan is None:
            raise AttributeError(
                f"aikit.elastic.{name} is set by init(): call aikit.elastic.Torch.init(...) "
                "or aikit.elastic.TF.init(...) first"
            )
        if name == "plan":
            return plan
        if name in PUBLIC:
            return getattr(plan, name)
        extras = latest_extras()
        if name in extras:
            return extras[name]
        raise AttributeError(
            f"aikit.elastic.{name} is set by aikit.elastic.TF.init(...); the latest init was PyTorch's"
        )
    raise AttributeError(f"module 'aikit.elastic' has no attribute {name!r}")
