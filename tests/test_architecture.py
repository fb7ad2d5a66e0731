"""docs/architecture.md's countable claims, measured from the code, so that they cannot drift.

Each test reads the number or the list the page states and compares it with what the code is:
module and class sizes, the modules ``import aikit.autolrs.Torch`` loads, the mutation audit's
mutants, the original systems' names the page lists. (The layers, the engines, the named errors
and the optional dependencies have tests of their own, named on the page.)
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

from test_layers import loaded_after

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def stated(pattern: str) -> list[str]:
    """Every match of ``pattern``'s first group on the page (it must state it at least once)."""
    found = re.findall(pattern, " ".join(PAGE.split()))
    assert found, f"docs/architecture.md no longer says {pattern!r}"
    return found


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of every module of aikit, and of every class (``ast``: its last line - its first + 1)."""
    modules, classes = {}, {}
    for path in sorted((ROOT / "aikit").rglob("*.py")):
        source, name = path.read_text(), path.relative_to(ROOT).as_posix()
        modules[name] = len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                classes[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return modules, classes


def test_no_module_and_no_class_is_longer_than_the_page_says():
    (module_limit, class_limit), = {(int(m), int(c)) for m, c in stated(
        r"No module of aikit is longer than (\d+) lines and no class longer than (\d+)")}
    modules, classes = sizes()
    assert {name: n for name, n in modules.items() if n > module_limit} == {}
    assert {name: n for name, n in classes.items() if n > class_limit} == {}


def test_the_modules_autolrs_loads_are_counted_right():
    (count,) = {int(n) for n in stated(r"`import aikit\.autolrs\.Torch` loads (\d+) modules of aikit")}
    loaded = loaded_after("import aikit.autolrs.Torch")
    assert len(loaded) == count, loaded


def test_the_mutation_audit_has_as_many_mutants_as_the_page_says():
    spec = importlib.util.spec_from_file_location("mutation_audit", ROOT / "scripts" / "mutation_audit.py")
    audit = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutation_audit", audit)
    spec.loader.exec_module(audit)
    counts = {int(n) for n in stated(r"plants (\d+) named, realistic bugs")} | \
        {int(n) for n in stated(r"\(all (\d+); ")}
    assert counts == {len(audit.MUTANTS)}
    names = [mutant[0] for mutant in audit.MUTANTS]
    assert len(set(names)) == len(names)  # a mutant is chosen by its name


def test_the_names_table_lists_every_original_name_the_edge_takes():
    """The page's Names table and ``aikit.runtime.originals.ORIGINAL_NAMES`` say the same: every
    original's name is on the row of the aikit name it stands for, with the system that wrote it."""
    from aikit.runtime.originals import ORIGINAL_NAMES

    table = PAGE[PAGE.index("## Names"):]
    rows = {row.split("|")[2].strip(" `"): row for row in table.splitlines()
            if row.startswith("| ") and row.count("|") >= 4 and "---" not in row}
    for alias, (name, system) in ORIGINAL_NAMES.items():
        assert name in rows, f"no row for {name} in the Names table"
        assert f"`{alias}`" in rows[name] and system.split("'")[0] in rows[name], (alias, rows[name])


# --- the house: one home for process state, the originals on top, shallow hierarchies ---------------
MUTATORS = {"append", "extend", "update", "clear", "pop", "popitem", "setdefault", "add", "discard", "remove",
            "insert"}


def module_state_writers() -> dict[str, list[str]]:
    """Every module of aikit whose functions change state that outlives a call: a name the module
    binds at its top level, rebound (``global``), assigned into or mutated in place; or a module's
    attributes written (``setattr``, ``sys.modules[...].x = ...``)."""
    found = {}
    for path in sorted((ROOT / "aikit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
               if isinstance(target, ast.Name)}
        hits = set()
        for function in (node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
            local = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
            for node in ast.walk(function):
                if isinstance(node, ast.Global):
                    hits.update(node.names)
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for target in targets:
                    base = target
                    while isinstance(base, (ast.Subscript, ast.Attribute)):
                        base = base.value
                    if base is not target and isinstance(base, ast.Name) and base.id in top and base.id not in local:
                        hits.add(base.id)
                    if isinstance(target, ast.Attribute) and "sys.modules" in ast.unparse(target.value):
                        hits.add(ast.unparse(target))
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                    base = node.func.value
                    if isinstance(base, ast.Name) and base.id in top and base.id not in local:
                        hits.add(base.id)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                        and "module" in ast.unparse(node.args[0]):
                    hits.add(f"setattr({ast.unparse(node.args[0])}, ...)")
        if hits:
            found[path.relative_to(ROOT).as_posix()] = sorted(hits)
    return found


def test_process_state_has_one_home_and_one_writer():
    """What aikit remembers between calls lives in ``runtime/process.py`` alone, and only its
    functions write it or a module's attributes (the plan ``init`` publishes)."""
    assert "`ProcessState` in `runtime/process.py`, written only by its functions" in " ".join(PAGE.split())
    assert module_state_writers() == {"aikit/runtime/process.py": ["_state", "setattr(module, ...)"]}


def classes() -> dict[tuple[str, str], tuple[int, list[tuple[str, str]]]]:
    """Every top-level class of aikit by (module, name): its lines and its aikit bases, each base
    found where the module defines or imports it (a name of torch's is no aikit class)."""
    defined, imported = {}, {}
    for path in sorted((ROOT / "aikit").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text())
        imported[module] = {alias.asname or alias.name: node.module for node in ast.walk(tree)
                            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aikit")
                            for alias in node.names}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                defined[module, node.name] = (node.end_lineno - node.lineno + 1,
                                              [base.id for base in node.bases if isinstance(base, ast.Name)])

    def resolve(module: str, name: str, hops: int = 0) -> tuple[str, str] | None:
        if (module, name) in defined:
            return module, name
        source = imported.get(module, {}).get(name)
        return None if source is None or hops > 5 else resolve(source, name, hops + 1)

    return {key: (lines, [found for base in bases if (found := resolve(key[0], base))])
            for key, (lines, bases) in defined.items()}


def test_no_aikit_class_builds_on_an_originals_class_and_no_hierarchy_is_deep():
    """The originals' vocabularies sit on top: no class outside their edge modules has one of
    theirs among its bases; and no chain of aikit classes is longer than the page says."""
    (limit,) = {int(n) for n in stated(r"no class hierarchy of aikit is deeper than (\d+) classes")}
    edges = {"aikit.elastic.Torch.eth_easl", "aikit.ga.Torch.runai"}
    found = classes()

    def ancestors(key: tuple[str, str]) -> set[tuple[str, str]]:
        return {key}.union(*(ancestors(base) for base in found[key][1]))

    def depth(key: tuple[str, str]) -> int:
        return 1 + max((depth(base) for base in found[key][1]), default=0)

    on_edges = {f"{module}.{name}" for (module, name) in found if module not in edges
                and any(base[0] in edges for base in ancestors((module, name)) - {(module, name)})}
    assert on_edges == set()
    assert {f"{m}.{n}": depth((m, n)) for (m, n) in found if depth((m, n)) > limit} == {}


def test_no_class_counted_with_its_aikit_bases_is_longer_than_the_page_says():
    """What a reader of one class must read: its lines and those of every aikit class it builds on."""
    (limit,) = {int(n) for n in stated(r"no class counted with its aikit bases is longer than (\d+) lines")}
    found = classes()

    def ancestors(key: tuple[str, str]) -> set[tuple[str, str]]:
        return {key}.union(*(ancestors(base) for base in found[key][1]))

    counted = {f"{m}.{n}": sum(found[a][0] for a in ancestors((m, n))) for (m, n) in found}
    assert {name: lines for name, lines in counted.items() if lines > limit} == {}


def keras_backend_names() -> tuple[set[str], set[str]]:
    """The modules of aikit that name Keras' backends: (those holding the registry ``SEAMS``, those
    comparing ``BACKEND`` with a string: a branch that a new backend would need as well)."""
    registry, branches = set(), set()
    for path in sorted((ROOT / "aikit").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SEAMS" for t in node.targets):
                registry.add(name)
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                strings = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
                if strings and any(getattr(s, "id", getattr(s, "attr", None)) == "BACKEND" for s in sides):
                    branches.add(name)
    return registry, branches


def test_a_new_keras_backend_is_as_many_files_as_the_page_says():
    """Its seam module, and the registry's file: no adapter branches on the backend's name."""
    (count,) = {int(n) for n in stated(r"a new Keras backend is (\d+) files")}
    registry, branches = keras_backend_names()
    assert registry == {"aikit/runtime/Keras/backend.py"}
    assert branches == set()
    assert count == 1 + len(registry | branches)
