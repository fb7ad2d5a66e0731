"""aikit's layers point down: every import of every module, read from the source (nothing runs).

core < runtime < ga < elastic, lr_finder, autolrs < integrations; the command line and the
stand-alone helpers (data set, plots) sit on top. A package imports its own layer's package
and the layers below, never a higher layer nor a sibling of its own layer; ``aikit.core`` (and
the framework-free corners of the runtime) import no framework; no function or class body
imports aikit (an import hidden there to dodge a cycle is a cycle). The same holds at run
time: importing an adapter loads no package above it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {
    "aikit": 0,  # the package itself (its __version__) and the one place optional dependencies load
    "aikit.optional": 0,
    "aikit.core": 1,
    "aikit.runtime": 2,
    "aikit.ga": 3,
    "aikit.elastic": 4,
    "aikit.lr_finder": 4,
    "aikit.autolrs": 4,
    # the Keras adapter, on every backend, in one home: its GA at the GA's layer, the rest above it
    "aikit.keras": 3,
    "aikit.keras.elastic": 4,
    "aikit.keras.lr_finder": 4,
    "aikit.keras.autolrs": 4,
    "aikit.integrations": 5,
    "aikit.cli": 6,
    "aikit.datasets": 6,
    "aikit.plot_adaptive": 6,
}
# one layer, and none imports another: each capability (its torch and Keras packages alike) keeps to itself
APART = {"aikit.elastic": "elastic", "aikit.keras.elastic": "elastic", "aikit.lr_finder": "lr_finder",
         "aikit.keras.lr_finder": "lr_finder", "aikit.autolrs": "autolrs", "aikit.keras.autolrs": "autolrs"}
FRAMEWORKS = {"torch", "torch_xla", "tensorflow", "keras", "horovod", "jax", "lightning", "transformers"}
# modules that load no framework: the core, the package inits above the adapters, and what
# every layer may import without one
FRAMEWORK_FREE = {"aikit", "aikit.optional", "aikit.core", "aikit.runtime", "aikit.runtime.process",
                  "aikit.runtime.originals", "aikit.runtime.exports", "aikit.runtime.range_results",
                  "aikit.runtime.state_cache", "aikit.runtime.plots", "aikit.ga", "aikit.elastic", "aikit.lr_finder",
                  "aikit.autolrs", "aikit.integrations"}


def framework_free(module: str) -> bool:
    return module in FRAMEWORK_FREE or module.startswith("aikit.core.")


def package(module: str) -> str | None:
    """The layered package ``module`` belongs to, the longest one of :data:`LAYERS` that holds it
    (``aikit.elastic.Torch.sampler`` -> ``aikit.elastic``, ``aikit.keras.elastic.model`` ->
    ``aikit.keras.elastic``), or None for a module no layer holds."""
    parts = module.split(".")
    if parts[0] != "aikit":
        return None
    if module == "aikit":
        return "aikit"
    held = [".".join(parts[:n]) for n in range(len(parts), 1, -1) if ".".join(parts[:n]) in LAYERS]
    return held[0] if held else None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[ast.stmt, str, bool]]:
    """Every import statement of ``tree``: (node, module imported, whether it is at module level,
    i.e. not inside a function or class body)."""
    found: list[tuple[ast.stmt, str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((child, alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package this module is in
                    anchor = module.split(".")[: len(module.split(".")) - child.level + is_package]
                    base = ".".join([*anchor, base] if base else anchor)
                found.append((child, base, top))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                        ast.Lambda)))

    visit(tree, True)
    return found


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Every layering rule ``sources`` break: module name -> (source text, is a package ``__init__``)."""
    found = []
    for module, (text, is_package) in sorted(sources.items()):
        own = package(module)
        if own is None:
            found.append(f"{module}: in no layer: add its package to LAYERS in tests/test_layers.py")
            continue
        for node, target, top in imports(ast.parse(text), module, is_package):
            where = f"{module}:{node.lineno}"
            root = target.split(".")[0]
            if root in FRAMEWORKS and framework_free(module):
                found.append(f"{where}: imports {target}, but {module} must load no framework")
            if root != "aikit":
                continue
            if not top:
                found.append(f"{where}: imports {target} inside a function or class: import it at the top "
                             "(if that makes a cycle, the code is in the wrong layer)")
            theirs = package(target)
            if theirs is None or theirs == own:
                continue
            if LAYERS[theirs] > LAYERS[own]:
                found.append(f"{where}: imports {target}, a higher layer ({theirs} > {own})")
            elif own in APART and theirs in APART and APART[own] != APART[theirs]:
                found.append(f"{where}: imports {target}, a sibling of {own} in the same layer")
    return found


def aikit_sources() -> dict[str, tuple[str, bool]]:
    return {module_name(path): (path.read_text(), path.name == "__init__.py")
            for path in sorted((ROOT / "aikit").rglob("*.py"))}


def package_circles(sources: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """aikit's top-level packages (``aikit.keras``, ``aikit.ga``, ...) that import one another in a
    loop, each loop once: the seed's Keras paths (``aikit.ga.TF`` and the like) import
    ``aikit.keras``, so ``aikit.keras`` must import none of their packages."""
    arrows: dict[str, set[str]] = {}
    for module, (text, is_package) in sources.items():
        own = ".".join(module.split(".")[:2])
        for _, target, _ in imports(ast.parse(text), module, is_package):
            theirs = ".".join(target.split(".")[:2])
            if theirs.startswith("aikit.") and theirs != own:
                arrows.setdefault(own, set()).add(theirs)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in arrows.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reached = {package: reach(package) for package in arrows}
    loops = {tuple(sorted(p for p in reached if p in reached[package] and package in reached[p]))
             for package in reached if package in reached[package]}
    return sorted(list(loop) for loop in loops)


def module_circles(sources: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """aikit's modules that import one another in a loop (the strongly connected components of the
    import graph with more than one module), ``TYPE_CHECKING`` imports counted: ``from pkg import
    sub`` points at the module ``pkg.sub`` where there is one, else at ``pkg``."""
    arrows: dict[str, set[str]] = {module: set() for module in sources}
    for module, (text, is_package) in sources.items():
        for node, target, _ in imports(ast.parse(text), module, is_package):
            names = [alias.name for alias in node.names] if isinstance(node, ast.ImportFrom) else [None]
            for name in names:
                found = f"{target}.{name}" if f"{target}.{name}" in sources else target
                if found in sources and found != module:
                    arrows[module].add(found)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def connect(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(arrows[module]):
            if other not in index:
                connect(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == module:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for module in sorted(arrows):
        if module not in index:
            connect(module)
    return sorted(loops)


def test_every_import_of_aikit_points_down():
    sources = aikit_sources()
    assert len(sources) > 50
    assert violations(sources) == []
    assert package_circles(sources) == []
    assert module_circles(sources) == []


def test_a_circle_of_modules_is_named_type_checking_imports_included():
    sources = {"aikit.elastic.Torch.sampler": ("from aikit.elastic.Torch.trace_optim import TraceOptimizer\n", False),
               "aikit.elastic.Torch.trace_optim": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                   "    from aikit.elastic.Torch import sampler\n", False),
               "aikit.elastic.Torch": ("", True)}
    assert module_circles(sources) == [["aikit.elastic.Torch.sampler", "aikit.elastic.Torch.trace_optim"]]


def test_a_circle_of_packages_is_named():
    sources = {"aikit.ga.TF.optimizers": ("from aikit.keras import optimizers\n", False),
               "aikit.keras.optimizers": ("from aikit.ga.exports import served\n", False),
               "aikit.keras.lr_finder": ("from aikit.runtime.range_results import RangeTestResults\n", False)}
    assert violations(sources) == []  # one layer: the layers alone let it through
    assert package_circles(sources) == [["aikit.ga", "aikit.keras"]]


@pytest.mark.parametrize(("module", "source", "complaint"), [
    ("aikit.runtime.Torch.planted", "from aikit.elastic.Torch import sampler\n", "a higher layer"),
    ("aikit.ga.Torch.planted", "import aikit.elastic\n", "a higher layer"),
    ("aikit.runtime.Torch.planted", "from aikit.ga.Torch.optim import Optimizer\n", "a higher layer"),
    ("aikit.core.planted", "from aikit.runtime.process import plan_of\n", "a higher layer"),
    ("aikit.autolrs.Torch.planted", "from aikit.elastic.Torch import CustomSampler\n", "a sibling"),
    ("aikit.lr_finder.Torch.planted", "from aikit.autolrs import plot\n", "a sibling"),
    ("aikit.ga.Torch.planted", "def f():\n    from aikit.runtime.Torch import collectives\n", "inside a function"),
    ("aikit.ga.Torch.planted", "class C:\n    import aikit.core.ga\n", "inside a function or class"),
    ("aikit.core.planted", "import torch\n", "must load no framework"),
    ("aikit.runtime.process", "from tensorflow import keras\n", "must load no framework"),
    ("aikit.runtime.Torch.planted", "from ...ga.Torch import optim\n", "a higher layer"),
    ("aikit.newpackage.planted", "import aikit.core\n", "in no layer"),
    ("aikit.keras.planted", "from aikit.keras.elastic import init\n", "a higher layer"),
    ("aikit.keras.autolrs", "from aikit.keras.lr_finder import LRFinder\n", "a sibling"),
    ("aikit.keras.elastic.planted", "import aikit.lr_finder.Torch\n", "a sibling"),
    ("aikit.keras.planted", "from aikit.autolrs.Torch import AutoLRS\n", "a higher layer"),
    ("aikit.runtime.plots", "import keras\n", "must load no framework"),
])
def test_an_upward_sideways_or_hidden_import_is_named(module, source, complaint):
    """Each rule, broken once: the checker names the module and the rule."""
    (found,) = violations({module: (source, False)})
    assert found.startswith(module) and complaint in found


def test_downward_and_own_package_imports_pass():
    sources = {
        "aikit.ga.Torch.fine": ("from aikit.runtime.Torch import collectives\nfrom aikit.ga.Torch.runai import x\n"
                                "import aikit.core.ga\nimport torch\n", False),
        "aikit.integrations.fine": ("import aikit.autolrs.Torch\nimport aikit.elastic.Torch\n", False),
        "aikit.elastic.Torch": ("from . import sampler\nimport aikit.ga.Torch\n", True),
        "aikit.cli": ("import aikit\nfrom aikit.core import plan\n", False),
        "aikit.elastic.TF": ("from aikit.keras import elastic\n", True),
        "aikit.keras.lr_finder": ("from aikit.runtime.range_results import RangeTestResults\nimport aikit.keras\n",
                                  False),
        "aikit.ga.TF.optimizers": ("from aikit.keras import optimizers\n", False),
    }
    assert violations(sources) == []


def loaded_after(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('aikit'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return done.stdout.split()


@pytest.mark.parametrize(("module", "above"), [
    ("aikit.autolrs.Torch", ("aikit.elastic", "aikit.ga", "aikit.lr_finder")),
    ("aikit.lr_finder.Torch", ("aikit.elastic", "aikit.ga", "aikit.autolrs")),
    ("aikit.ga.Torch", ("aikit.elastic", "aikit.lr_finder", "aikit.autolrs")),
])
def test_importing_an_adapter_loads_nothing_above_it(module, above):
    """``import aikit.autolrs.Torch`` loads AutoLRS, the core and the runtime it uses: not the
    elastic or GA packages (it once loaded 16 of their modules through elastic's __init__)."""
    loaded = loaded_after(f"import {module}")
    assert module in loaded
    assert [name for name in loaded if name.startswith(above)] == []


def test_autolrs_loads_the_core_it_needs_and_not_the_trace_reader():
    """The core's names load with their module on first use: AutoLRS needs core.autolrs (and
    lr_range), not the trace reader, the schedule or the pandas they import."""
    loaded = loaded_after("import aikit.autolrs.Torch, sys; assert 'pandas' not in sys.modules")
    assert "aikit.core.autolrs" in loaded and "aikit.core.lr_range" in loaded
    assert [name for name in loaded if name in ("aikit.core.trace", "aikit.core.schedule", "aikit.core.scaling")] == []


def test_the_runtime_package_loads_no_module_of_aikit_by_itself():
    loaded = loaded_after("import aikit.runtime.Torch")
    assert loaded == ["aikit", "aikit.optional", "aikit.runtime", "aikit.runtime.Torch"]


@pytest.mark.parametrize("statement", [
    "from aikit.elastic.Torch.distributed import world_size; import aikit.runtime.Torch.distributed as new; "
    "assert world_size is new.world_size",
    "import aikit.elastic.Torch.spmd, aikit.runtime.Torch.spmd; "
    "assert aikit.elastic.Torch.spmd is aikit.runtime.Torch.spmd",
    "from aikit.elastic.Torch import distributed, spmd; import aikit.runtime.Torch.distributed as d; "
    "assert distributed is d and spmd.__name__ == 'aikit.runtime.Torch.spmd'",
    "from aikit.plot_adaptive import plot_adaptive; import aikit.runtime.plots as plots; "
    "assert plot_adaptive is plots.plot_adaptive",
])
def test_moved_modules_keep_their_old_public_paths(statement):
    """``aikit.elastic.Torch.distributed``, ``.spmd`` and ``aikit.plot_adaptive`` are paths users
    write: the very modules of ``aikit.runtime``, importable from a fresh interpreter; what lies at the old path is
    no copy of either (it defines nothing, it only hands over the module) and nothing is
    registered for it until it is imported."""
    loaded = loaded_after(statement)
    for old in ("aikit/elastic/Torch/distributed.py", "aikit/elastic/Torch/spmd.py", "aikit/elastic/TF/strategies.py",
                "aikit/plot_adaptive.py"):
        tree = ast.parse((ROOT / old).read_text())
        assert not [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))], old
    imported = set(re.findall(r"aikit\.elastic\.Torch\.(?:distributed|spmd)", statement))
    assert imported <= set(loaded)
    assert "aikit.elastic.Torch.spmd" not in loaded_after("import aikit.elastic.Torch")


@pytest.mark.slow
def test_the_keras_strategies_keep_their_old_public_path():
    loaded = loaded_after("import aikit.elastic.TF.strategies as old, aikit.runtime.Keras.strategies as new; "
                          "assert old is new")
    assert "aikit.elastic.TF.strategies" in loaded


def test_every_mutant_of_the_mutation_audit_still_applies():
    """scripts/mutation_audit.py plants bugs by text in named files: after code moves, each patch
    must still find its text exactly once, or the audit silently tests less."""
    done = subprocess.run([sys.executable, "scripts/mutation_audit.py", "--check"], capture_output=True, text=True,
                          cwd=ROOT)
    assert (done.returncode, done.stdout) == (0, "")
