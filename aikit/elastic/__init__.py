"""Elastic training: ``aikit.elastic.Torch.init(...)`` or ``aikit.elastic.TF.init(...)``.

After either ``init``, the plan's attributes (``steps``, ``batch_size``, ``global_batch_size``,
``gpus``, ``master``) and the plan itself (``plan``) can also be read here, as Run:AI's AIkit
Elastic writes them (``aikit.elastic.batch_size``); after the Keras ``init`` also its
``strategy`` (TensorFlow) or ``distribution`` (JAX), and under Horovod ``hvd``. They are those
of the latest ``init``, kept by :mod:`aikit.runtime.process`. Once ``aikit.keras.elastic``
(``aikit.elastic.TF``) is imported, ``aikit.elastic.models``
is its ``model`` module, as Run:AI's AIkit Elastic writes ``aikit.elastic.models.Model(model)``.
"""

from __future__ import annotations

import sys

from aikit.runtime.process import PUBLIC, latest

_KERAS_MODELS = "aikit.keras.elastic.model"


def __getattr__(name: str):
    if name == "models":
        if _KERAS_MODELS not in sys.modules:
            raise AttributeError("aikit.elastic.models is the Keras Model wrapper's module: import aikit.keras.elastic "
                                 "(or aikit.elastic.TF) first (Run:AI's AIkit Elastic's `import runai.elastic.keras`)")
        return sys.modules[_KERAS_MODELS]
    if name in (*PUBLIC, "plan", "strategy", "distribution", "hvd"):
        if latest() is None:
            raise AttributeError(
                f"aikit.elastic.{name} is set by init(): call aikit.elastic.Torch.init(...) "
                "or aikit.elastic.TF.init(...) first"
            )
        plan, extras = latest()
        if name == "plan":
            return plan
        if name in PUBLIC:
            return getattr(plan, name)
        if name in extras:
            return extras[name]
        if name == "hvd":
            raise AttributeError("aikit.elastic.hvd is the Horovod module an init() under Horovod ran with; the "
                                 "latest init() did not run under Horovod")
        raise AttributeError(
            f"aikit.elastic.{name} is set by aikit.elastic.TF.init(...); the latest init was PyTorch's"
        )
    raise AttributeError(f"module 'aikit.elastic' has no attribute {name!r}")
