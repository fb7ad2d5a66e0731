"""Elastic training: ``aikit.elastic.Torch.init(...)`` or ``aikit.elastic.TF.init(...)``.

After either ``init``, the plan's attributes (``steps``, ``batch_size``, ``global_batch_size``,
``gpus``, ``master``) can also be read here, as Run:AI's AIkit Elastic writes them
(``aikit.elastic.batch_size``); after the Keras ``init`` under Horovod, ``hvd`` too. The plan
itself is kept by :mod:`aikit.runtime.published`.
"""

from __future__ import annotations

from aikit.runtime.published import PUBLIC, latest_plan


def __getattr__(name: str):
    if name in PUBLIC:
        plan = latest_plan()
        if plan is None:
            raise AttributeError(
                f"aikit.elastic.{name} is set by init(): call aikit.elastic.Torch.init(...) "
                "or aikit.elastic.TF.init(...) first"
            )
        return getattr(plan, name)
    raise AttributeError(f"module 'aikit.elastic' has no attribute {name!r}")
