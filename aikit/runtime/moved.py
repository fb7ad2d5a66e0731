"""Old import paths of modules that moved into ``aikit.runtime``: one mechanism, no copies.

``aikit.elastic.Torch.distributed``, ``aikit.elastic.Torch.spmd`` and
``aikit.elastic.TF.strategies`` are paths users write; the modules now live in
``aikit.runtime``. The package that published them registers each under its old name in
``sys.modules``, so ``import aikit.elastic.Torch.spmd`` and ``from
aikit.elastic.Torch.distributed import world_size`` give the very same module object.
"""

from __future__ import annotations

import sys
import types


def keep_old_paths(package: types.ModuleType, *modules: types.ModuleType) -> None:
    """Make every module of ``modules`` importable as ``<package>.<its short name>`` too, and an
    attribute of ``package`` (call it from ``package``'s ``__init__``)."""
    for module in modules:
        short = module.__name__.rpartition(".")[2]
        sys.modules[f"{package.__name__}.{short}"] = module
        setattr(package, short, module)
