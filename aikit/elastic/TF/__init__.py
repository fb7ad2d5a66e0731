"""The seed's path of aikit's elastic Keras training, :mod:`aikit.keras.elastic` (on every Keras
backend): ``aikit.elastic.TF.init(...)``, ``aikit.elastic.TF.model.Model(model)``, ``fit_trace``,
``fit_adaptive``. Every name is that module's, read from it when asked (PEP 562), so the plan an
``init`` publishes (``aikit.elastic.TF.steps``, ``.strategy``, ...) is the one it holds; the
submodules' old paths (``aikit.elastic.TF.model``, ``.trace``, ...) hand over the very modules.
"""

from aikit.keras import elastic


def __getattr__(name: str):
    return getattr(elastic, name)


def __dir__() -> list[str]:
    return dir(elastic)


__all__ = elastic.__all__
