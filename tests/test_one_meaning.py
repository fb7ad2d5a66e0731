"""One name per thing, one meaning per name (issue 43, item 4), read off aikit's source.

aikit's vocabulary: a *step* is an update (a trace's row, ``steps`` of a trace or of AutoLRS);
the micro-steps of one update are ``micro_steps`` and the micro-step an update has reached is
``micro_step``; the replica count is ``num_replicas``; a multiplier of a gradient is a
``factor``, while ``weight`` is the count of loss terms users declare; the per-device batch is
``device_batch`` and ``batch_size`` read off a plan is Run:AI's (per device) only where its
users write it. The original systems' names stay at the edge, where their users write them:
each exception below says whose name it is. Every test names each offender, file and line.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_AND_RUNTIME = ("aikit/core", "aikit/runtime")
EVERYWHERE = ("aikit",)

# modules whose ``steps`` are updates (a trace's rows, a batch schedule's, AutoLRS's budget)
UPDATE_STEPS = ("aikit/core/trace.py", "aikit/core/batch_schedule.py", "aikit/core/ramp.py",
                "aikit/core/schedule.py", "aikit/core/autolrs/")
# the edge, (file, name): Run:AI's AIkit Elastic's table on the plan; the Keras GA optimizer's
# ``steps``, Run:AI's public setter, which the Keras runtime sets for a distributed update
STEPS_EDGE = {("aikit/core/plan.py", "steps"), ("aikit/runtime/Keras/training.py", "steps")}
# Run:AI's own ``gpus`` where its users pass it (init, make_plan, the CLI's --gpus, plan_arguments)
# and the plan's alias of it; ``world`` of the ramp schedules: ``threshold_schedule(..., world=8)``
# as Megatron users write its world size (docs/trace.md), and the check it passes to
REPLICAS_EDGE = {
    ("aikit/core/plan.py", "devices_here", "gpus"), ("aikit/core/plan.py", "make_plan", "gpus"),
    ("aikit/core/plan.py", "gpus", "self"),
    ("aikit/elastic/Torch/__init__.py", "init", "gpus"), ("aikit/keras/elastic/__init__.py", "init", "gpus"),
    ("aikit/integrations/huggingface.py", "plan_arguments", "gpus"),
    *{("aikit/core/ramp.py", function, "world") for function in (
        "threshold_schedule", "rampup", "linear_schedule", "staged_schedule", "seesaw_schedule")},
    *{("aikit/core/batch_schedule.py", function, "world") for function in (
        "__init__", "problems", "world_fit_problem")},
}
# stored attributes: the ramp schedule's ``world`` (above); the range test's ``replicas``, an object
# (``Replicas``: their sum and broadcast), not a count
REPLICA_ATTRIBUTES_EDGE = {("aikit/core/batch_schedule.py", "world"), ("aikit/core/lr_range/driver.py", "replicas")}
REPLICA_SYNONYMS = {"world", "world_size", "replicas", "gpus", "n_replicas", "num_gpus"}
# aikit 0.x's names, kept as read-only aliases where users wrote them: (file, class, name)
COUNTER_ALIASES = {("aikit/ga/Torch/window.py", "KeptNames", "position")}


@functools.cache
def parsed(text: str, path: str) -> ast.Module:
    return ast.parse(text, path)


def sources(*roots: str) -> Iterator[tuple[str, ast.Module]]:
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            yield str(path.relative_to(ROOT)), parsed(path.read_text(), str(path))


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    return [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]


def functions(tree: ast.Module) -> Iterator[tuple[str | None, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function with the class it is defined in (None for a module's or a nested one's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node.name, item
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for item in ast.walk(node):
                if item is not node and isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield None, item
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, node


def defined_names(tree: ast.Module) -> Iterator[tuple[int, str, str]]:
    """``(line, what, name)``: every parameter, function, class field, stored attribute and
    assigned local of a module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.lineno, "function", node.name
            for arg in parameters(node):
                yield arg.lineno, f"parameter of {node.name}()", arg.arg
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.lineno, "attribute", node.attr
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.lineno, "name", node.id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.lineno, "field", node.target.id


def steps_offenders(roots: tuple[str, ...] = CORE_AND_RUNTIME) -> list[str]:
    """``steps`` in the core and the runtime outside the modules whose steps are updates: there
    the micro-steps of an update are ``micro_steps`` (Run:AI's ``Plan.steps`` the one alias)."""
    found = []
    for path, tree in sources(*roots):
        if path.startswith(UPDATE_STEPS):
            continue
        for line, what, name in defined_names(tree):
            if name == "steps" and (path, name) not in STEPS_EDGE:
                found.append(f"{path}:{line}: {what} steps (the micro-steps of an update are micro_steps)")
    return found


def test_steps_are_updates_and_micro_steps_are_micro_steps():
    assert steps_offenders() == []


def test_the_plans_micro_steps_keep_run_ais_names_as_read_only_aliases():
    from aikit.core.plan import Plan, make_plan

    plan = make_plan(256, 64, 3)
    assert (plan.micro_steps, plan.num_replicas, plan.device_batch) == (2, 3, 43)
    assert (plan.steps, plan.gpus, plan.batch_size, plan.max_gpu_batch_size) == (2, 3, 43, 64)  # Run:AI's table
    assert "micro_steps" in Plan.__dataclass_fields__ and "steps" not in Plan.__dataclass_fields__
    assert "num_replicas" in Plan.__dataclass_fields__ and "gpus" not in Plan.__dataclass_fields__
    with pytest.raises(AttributeError):
        plan.steps = 3  # an alias, not a second field


def counter_offenders(roots: tuple[str, ...] = EVERYWHERE) -> list[str]:
    """The micro-step an update has reached is ``micro_step``: no ``position`` (the GA wrapper's
    first name) nor ``micro`` (the trace optimizer's and sampler's) is defined as a counter,
    but the aliases kept where users wrote them."""
    found = []
    for path, tree in sources(*roots):
        for cls, function in functions(tree):
            if function.name == "position" and (path, cls, "position") not in COUNTER_ALIASES:
                found.append(f"{path}:{function.lineno}: {cls}.position() (the counter is micro_step)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in (
                    "position", "micro"):
                found.append(f"{path}:{node.lineno}: attribute .{node.attr} (the counter is micro_step)")
    return found


def test_one_micro_step_counter():
    assert counter_offenders() == []


# ``micro_steps`` is the micro-steps of one update (``EpochSchedule.micro_steps``, each update's);
# the GA wrappers' count of every micro-step taken is ``micro_steps_taken``, and ``micro_steps``,
# its first name (Run:AI's ``runai.step`` in aikit's migration), an alias: (file, class)
MICRO_STEPS_DEFINED = {("aikit/core/schedule.py", "EpochSchedule"), ("aikit/ga/Torch/window.py", "KeptNames"),
                       ("aikit/keras/optimizers.py", "Optimizer")}


def micro_steps_offenders(roots: tuple[str, ...] = EVERYWHERE) -> list[str]:
    """No ``micro_steps`` counts the micro-steps taken: no attribute of that name is stored, and
    the properties of that name are the micro-steps of an update or the kept aliases."""
    found = []
    for path, tree in sources(*roots):
        for cls, function in functions(tree):
            if function.name == "micro_steps" and (path, cls) not in MICRO_STEPS_DEFINED:
                found.append(f"{path}:{function.lineno}: {cls}.micro_steps (micro-steps taken are micro_steps_taken)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr == "micro_steps":
                found.append(f"{path}:{node.lineno}: attribute .micro_steps (micro-steps taken are micro_steps_taken)")
    return found


def test_micro_steps_are_an_updates_and_the_micro_steps_taken_are_counted_apart():
    assert micro_steps_offenders() == []


def test_the_counter_and_its_aliases_agree():
    import torch

    from aikit.ga.Torch.optim import Optimizer

    net = torch.nn.Linear(2, 1)
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 3)
    net(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert optimizer.micro_step == optimizer.position == 1  # aikit 0.x's name still reads it
    assert optimizer.micro_steps_taken == optimizer.micro_steps == 1  # every step(), Run:AI's runai.step
    assert optimizer.steps == 3 and optimizer.state_dict()["ga"]["position"] == 1  # the saved format keeps its keys


def test_the_engine_updates_and_its_wrappers_step():
    """``step()`` is a micro-step in every wrapper; the engine's update is ``update()``."""
    from aikit.runtime.Torch.accumulator import Accumulator

    assert hasattr(Accumulator, "update") and hasattr(Accumulator, "end_micro_step")
    assert not hasattr(Accumulator, "step") and not hasattr(Accumulator, "micro_step")
    calls = []
    for path, tree in sources("aikit"):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("step", "micro_step")
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "engine"):
                calls.append(f"{path}:{node.lineno}: engine.{node.func.attr}()")
    assert calls == []


def replica_offenders(roots: tuple[str, ...] = EVERYWHERE) -> list[str]:
    """The replica count is ``num_replicas``: no parameter of aikit's is ``world``, ``world_size``,
    ``replicas`` or ``gpus`` (an object of the replicas, annotated so, is not a count), but
    where an original's or its users' spelling is the edge."""
    found = []
    for path, tree in sources(*roots):
        for _, function in functions(tree):
            for arg in parameters(function):
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else "int"
                if (arg.arg in REPLICA_SYNONYMS and annotation in ("int", "object", "int | None")
                        and (path, function.name, arg.arg) not in REPLICAS_EDGE):
                    found.append(f"{path}:{arg.lineno}: {function.name}({arg.arg}) (the count is num_replicas)")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr in REPLICA_SYNONYMS
                    and (path, node.attr) not in REPLICA_ATTRIBUTES_EDGE):
                found.append(f"{path}:{node.lineno}: attribute .{node.attr} (the count is num_replicas)")
    return sorted(set(found))


def test_the_replica_count_has_one_name():
    assert replica_offenders() == []


def factor_offenders() -> list[str]:
    """A multiplier of a gradient is a ``factor``: the module that multiplies the gradient
    entering a model's outputs names no ``weight`` (the count users declare is passed to it as
    the factor it is)."""
    found = []
    for path, tree in sources("aikit/runtime/Torch"):
        if path != "aikit/runtime/Torch/output_weights.py":
            continue
        for line, what, name in defined_names(tree):
            if name == "weight":
                found.append(f"{path}:{line}: {what} weight (a multiplier is a factor)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "weight":
                found.append(f"{path}:{node.lineno}: .weight (a multiplier is a factor)")
    return found


def test_a_multiplier_is_a_factor_and_a_weight_a_count():
    assert factor_offenders() == []


def device_batch_offenders() -> list[str]:
    """aikit reads a plan's per-device batch as ``device_batch``: ``batch_size`` (Run:AI's
    per-device name, and everywhere else a global batch) is never read off a plan in aikit."""
    found = []
    for path, tree in sources("aikit"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "batch_size" and isinstance(node.ctx, ast.Load):
                owner = ast.unparse(node.value)
                if owner in ("p", "plan", "new_plan", "self.plan", "smaller") or owner.endswith(".plan"):
                    found.append(f"{path}:{node.lineno}: {owner}.batch_size (the per-device batch is device_batch)")
    return found


def test_a_plans_per_device_batch_is_read_as_device_batch():
    assert device_batch_offenders() == []


PLANTED = {
    "steps": ("aikit/core/ga.py", "def planted(steps: int) -> int:\n    return steps\n", steps_offenders),
    "position": ("aikit/ga/Torch/window.py", "class P:\n    def f(self):\n        self.position = 0\n",
                 counter_offenders),
    "micro": ("aikit/elastic/Torch/sampler.py", "class P:\n    def f(self):\n        self.micro = 0\n",
              counter_offenders),
    "micro_steps": ("aikit/runtime/Torch/backward_marks.py",
                    "class P:\n    def f(self):\n        self.micro_steps = 0\n", micro_steps_offenders),
    "world": ("aikit/runtime/Torch/collectives.py", "def planted(world: int) -> int:\n    return world\n",
              replica_offenders),
    "weight": ("aikit/runtime/Torch/output_weights.py", "def planted(grad, weight):\n    return grad * weight\n",
               factor_offenders),
    "batch_size": ("aikit/core/device_batch.py", "def planted(plan):\n    return plan.batch_size\n",
                   device_batch_offenders),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_double_meaning_is_named(name, monkeypatch):
    """Each scan fails on a double meaning planted in a module it reads, naming file and line."""
    path, planted, scan = PLANTED[name]
    original = Path.read_text

    def read_text(self: Path, *args, **kwargs) -> str:
        text = original(self, *args, **kwargs)
        return text + "\n\n" + planted if self == ROOT / path else text

    assert all(not offender.startswith(path + ":") or name not in offender for offender in scan())
    monkeypatch.setattr(Path, "read_text", read_text)
    offenders = scan()
    assert any(offender.startswith(path + ":") and name in offender for offender in offenders), offenders
