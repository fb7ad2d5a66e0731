"""Every Keras backend's seam module provides the whole :class:`~aikit.runtime.Keras.backend.Seam`
protocol, with the protocol's arguments: each module is read from its source (a module imports
its framework, and Keras runs one backend per process), and the module this process loaded is
checked as it runs too (tests/test_keras_backends.py runs this file on every backend)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

from aikit.runtime.Keras.backend import SEAMS, Seam, seam


def protocol() -> dict[str, list[tuple[str, bool]] | None]:
    """What :class:`Seam` asks of a module: each function's arguments (name, has a default),
    without ``self``; None for a constant."""
    members: dict[str, list[tuple[str, bool]] | None] = dict.fromkeys(Seam.__annotations__)
    for name, value in vars(Seam).items():
        if not name.startswith("_") and inspect.isfunction(value):
            parameters = list(inspect.signature(value).parameters.values())[1:]
            members[name] = [(p.name, p.default is not p.empty) for p in parameters]
    return members


def provided(source: str) -> dict[str, list[tuple[str, bool]] | None]:
    """What a module's source defines at its top: functions with their arguments, and constants,
    its own or imported from another aikit module."""
    found: dict[str, list[tuple[str, bool]] | None] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            arguments = [*node.args.posonlyargs, *node.args.args]
            defaults = len(node.args.defaults)
            found[node.name] = [(a.arg, i >= len(arguments) - defaults) for i, a in enumerate(arguments)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aikit."):
            imported = provided(Path(importlib.util.find_spec(node.module).origin).read_text())
            found.update({alias.asname or alias.name: imported[alias.name] for alias in node.names
                          if alias.name in imported})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    found[target.id] = None
    return found


def lacks(defined: dict[str, list[tuple[str, bool]] | None]) -> list[str]:
    """The protocol's members a module lacks, or defines with other arguments."""
    found = []
    for name, wanted in protocol().items():
        if name not in defined:
            found.append(f"{name}: missing")
        elif defined[name] != wanted:
            found.append(f"{name}: takes {defined[name]}, the protocol {wanted}")
    return found


@pytest.mark.parametrize("backend", SEAMS)
def test_every_backend_module_provides_the_whole_protocol(backend):
    path = Path(importlib.util.find_spec(SEAMS[backend]).origin)
    assert lacks(provided(path.read_text())) == []


def test_the_loaded_module_provides_it_as_it_runs():
    """What the source says is what the module has (the reading above is not blind)."""
    defined = {name: None if name in Seam.__annotations__ else
               [(p.name, p.default is not p.empty) for p in inspect.signature(getattr(seam, name)).parameters.values()]
               for name in protocol() if hasattr(seam, name)}
    assert lacks(defined) == []
    assert isinstance(seam.INT_MAX, int) and all(isinstance(getattr(seam, flag), bool) for flag in
                                                 ("PER_REPLICA_DECLARATION", "UPDATE_ALL_REDUCES", "HOROVOD"))


def test_a_module_that_lacks_part_of_the_protocol_is_named():
    source = ("INT_MAX = 2**31 - 1\n"
              "def replicas():\n    return 1\n"
              "def cond(pred, true_fn, false_fn, variables=()):\n    return true_fn() if pred else false_fn()\n"
              "def scope(strategy):\n    return None\n")
    missing = lacks(provided(source))
    assert "replicas: missing" not in missing and "INT_MAX: missing" not in missing
    assert "HOROVOD: missing" in missing and "merged_update: missing" in missing
    assert any(line.startswith("cond: takes") for line in missing)  # a default the protocol has not
    assert any(line.startswith("scope: takes [('strategy'") for line in missing)
