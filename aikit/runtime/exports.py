"""A GA module's names served from a dict, through PEP 562's module ``__getattr__`` and
``__dir__``: Run:AI's prebuilt GA classes (``aikit.ga.Torch.optim.Adam``, ``aikit.ga.TF.optimizers.Adam``
and the rest, one per optimizer class the installed framework has) are made once at import into
a dict and served from it, so no module's namespace is written (``globals().update``)."""

from __future__ import annotations

import sys
from collections.abc import Callable


def served(module: str, names: dict[str, object]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``module`` that serve ``names`` beside its own."""

    def __getattr__(name: str) -> object:
        try:
            return names[name]
        except KeyError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted({*sys.modules[module].__dict__, *names})

    return __getattr__, __dir__
