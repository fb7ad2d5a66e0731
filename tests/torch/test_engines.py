"""The engines as objects (aikit.runtime.Torch.engines): every registered engine provides the
whole protocol, detection picks what it always picked, and no module outside the engine package
names an engine. Horovod and torch_xla are stood in for where their world matters; the real ones
run in tests/horovod and tests/trace/test_xla*.py."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_layers import imports, module_name

from aikit.core.errors import InvalidState
from aikit.runtime.Torch import collectives, distributed, engines
from aikit.runtime.Torch.engines import ENGINES, Engine

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


def protocol_members() -> dict[str, inspect.Signature | None]:
    """What :class:`Engine` asks of an engine: its methods' signatures, None for its attributes."""
    members: dict[str, inspect.Signature | None] = dict.fromkeys(Engine.__annotations__)
    for name, value in vars(Engine).items():
        if not name.startswith("_") and inspect.isfunction(value):
            members[name] = inspect.signature(value)
    return members


def lacks(engine: object) -> list[str]:
    """The protocol members ``engine`` lacks or takes other arguments for."""
    found = []
    for name, signature in protocol_members().items():
        if not hasattr(engine, name):
            found.append(f"{name}: missing")
        elif signature is not None:
            method = getattr(engine, name)
            wanted = list(signature.parameters)[1:]  # without self
            if not callable(method) or list(inspect.signature(method).parameters) != wanted:
                found.append(f"{name}: not a method taking {wanted}")
    return found


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()


def fake_horovod(monkeypatch, size: int, rank: int) -> None:
    """An initialised ``horovod.torch`` of ``size`` ranks, as the program would have imported it."""
    hvd = types.SimpleNamespace(is_initialized=lambda: True, size=lambda: size, rank=lambda: rank,
                                local_rank=lambda: rank % 2)
    monkeypatch.setitem(sys.modules, "horovod.torch", hvd)


def fake_torch_xla(monkeypatch, local: int, ordinal: int) -> None:
    """An imported torch_xla of ``local`` replicas on this host (not SPMD)."""
    runtime = types.SimpleNamespace(is_spmd=lambda: False, world_size=lambda: local, global_ordinal=lambda: ordinal,
                                    local_ordinal=lambda: ordinal)
    monkeypatch.setitem(sys.modules, "torch_xla", types.SimpleNamespace(runtime=runtime))
    monkeypatch.setitem(sys.modules, "torch_xla.runtime", runtime)


def torchrun_environment(monkeypatch, world: int, rank: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


# ---- the protocol --------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES, ids=lambda engine: engine.name)
def test_every_registered_engine_provides_the_whole_protocol(engine):
    assert lacks(engine) == []
    assert isinstance(engine.name, str) and isinstance(engine.label, str) and isinstance(engine.lazy, bool)


def test_an_engine_that_lacks_part_of_the_protocol_is_named():
    class Partial:
        name = label = "partial"
        lazy = False

        def in_use(self) -> bool:
            return False

        def mark_step(self) -> None:  # without the device
            pass

    missing = lacks(Partial())
    assert "world_size: missing" in missing and "all_reduce_sum_: missing" in missing
    assert "mark_step: not a method taking ['device']" in missing
    assert "in_use: missing" not in missing and "lazy: missing" not in missing


def test_the_registry_names_each_engine_once_in_detection_order_and_ends_with_one_process():
    names = [engine.name for engine in ENGINES]
    assert len(set(names)) == len(names) and tuple(names) == distributed.ENGINES
    known = ("torch.distributed", "horovod", "xla", "single")  # a new engine may go anywhere before the last
    assert [name for name in names if name in known] == list(known)
    assert ENGINES[-1].launched() and not ENGINES[-1].in_use()


# ---- detection, in one process -------------------------------------------------------------


def test_one_process_is_single_with_collectives_that_change_nothing():
    assert (distributed.engine(), distributed.world_size(), distributed.rank(), distributed.local_rank()) == (
        "single", 1, 0, 0)
    assert distributed.current().label == "one process"
    tensor = torch.ones(3)
    collectives.all_reduce_sum_([tensor])
    collectives.broadcast_([tensor], src=0)
    assert torch.equal(tensor, torch.ones(3))
    assert collectives.broadcast_object({"a": 1}) == {"a": 1}
    assert not collectives.can_start_all_reduce("cpu") and not collectives.lazy("cpu")
    assert distributed.current().resizing() is None


def test_torchruns_variables_without_a_group_are_torch_distributed_and_refuse_to_train_apart(monkeypatch):
    torchrun_environment(monkeypatch, world=2, rank=1)
    assert (distributed.engine(), distributed.world_size(), distributed.rank(), distributed.local_rank(),
            distributed.device_count()) == ("torch.distributed", 2, 1, 1, 2)
    message = (r"this process runs under torchrun \(WORLD_SIZE=2\) but no process group is initialised: call "
               r"torch.distributed.init_process_group\('gloo' or 'nccl'\) before training, or the replicas would "
               r"train apart")
    for collective in (lambda: collectives.all_reduce_sum_([torch.ones(2)]),
                       lambda: collectives.broadcast_([torch.ones(2)]),
                       lambda: collectives.broadcast_object(1)):
        with pytest.raises(InvalidState, match=message):
            collective()
    assert not collectives.can_start_all_reduce("cpu")


def test_an_initialised_group_wins_over_horovod_and_torch_xla(monkeypatch):
    fake_horovod(monkeypatch, size=4, rank=3)
    fake_torch_xla(monkeypatch, local=2, ordinal=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert (distributed.engine(), distributed.world_size(), distributed.rank()) == ("torch.distributed", 1, 0)
    finally:
        dist.destroy_process_group()


def test_horovod_wins_over_torch_xla_and_torchruns_variables(monkeypatch):
    torchrun_environment(monkeypatch, world=2, rank=0)
    fake_torch_xla(monkeypatch, local=2, ordinal=1)
    fake_horovod(monkeypatch, size=4, rank=3)
    assert (distributed.engine(), distributed.world_size(), distributed.rank(), distributed.local_rank()) == (
        "horovod", 4, 3, 1)


def test_torch_xla_wins_over_torchruns_variables_and_counts_replicas_over_hosts(monkeypatch):
    torchrun_environment(monkeypatch, world=2, rank=0)
    monkeypatch.setenv("MY_HOST_WORLD_SIZE", "3")
    monkeypatch.setenv("MY_HOST_ORDINAL", "2")
    fake_torch_xla(monkeypatch, local=2, ordinal=1)
    assert (distributed.engine(), distributed.world_size(), distributed.rank(), distributed.local_rank()) == (
        "xla", 6, 5, 1)
    assert collectives.lazy("cpu")  # the process's engine is lazy, whatever the tensors' device


def test_tensors_on_an_xla_device_go_through_xla_whatever_the_process_runs(monkeypatch):
    torchrun_environment(monkeypatch, world=2, rank=0)
    assert collectives.engine("xla") == "xla" and collectives.engine("xla:1") == "xla"
    assert collectives.engine("cpu") == collectives.engine() == "torch.distributed"
    assert collectives.lazy("xla") and not collectives.can_start_all_reduce("xla")
    assert engines.current(torch.device("xla")) is engines.current("xla")


# ---- no engine named outside the engine package ---------------------------------------------

ENGINE_PACKAGE = "aikit/runtime/Torch/engines/"
# the optional dependencies' table names modules and extras (horovod, xla), not engines
NOT_ABOUT_ENGINES = {"aikit/optional.py"}
NAMES = {engine.name for engine in ENGINES} | {"xla"}  # "xla" is torch's device type too


def engine_literals(path: str, source: str) -> list[str]:
    """The string constants of ``source`` that name an engine or the XLA device type."""
    return [node.value for node in ast.walk(ast.parse(source, path))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES]


def literals_outside_the_engines() -> dict[str, list[str]]:
    found = {}
    for path in sorted((ROOT / "aikit").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(ENGINE_PACKAGE) or name in NOT_ABOUT_ENGINES:
            continue
        if literals := engine_literals(name, path.read_text()):
            found[name] = literals
    return found


def test_no_module_outside_the_engine_package_names_an_engine():
    assert literals_outside_the_engines() == {}


PACKAGE = "aikit.runtime.Torch.engines"
ENGINE_MODULES = {type(engine).__module__ for engine in ENGINES}  # where each engine's class lives


def engine_imports(module: str, source: str, is_package: bool = False) -> list[str]:
    """The engine modules ``source`` imports by name (``from aikit.runtime.Torch.engines.xla
    import XLA``, ``from aikit.runtime.Torch.engines import horovod``), not the package's face."""
    found = []
    for _, target, _ in imports(ast.parse(source), module, is_package):
        if target in ENGINE_MODULES:
            found.append(target)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module == PACKAGE:
            found += [f"{PACKAGE}.{alias.name}" for alias in node.names if f"{PACKAGE}.{alias.name}" in ENGINE_MODULES]
    return found


def test_no_module_outside_the_engine_package_imports_an_engine_module():
    """Only the package (the protocol, the registry, ``current``) is imported from outside it, so a
    new engine is its module and its line in ``ENGINES``."""
    assert len(ENGINE_MODULES) == len(ENGINES) and f"{PACKAGE}.xla" in ENGINE_MODULES  # one module per engine
    found = {}
    for path in sorted((ROOT / "aikit").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith(ENGINE_PACKAGE) and (hits := engine_imports(module_name(path), path.read_text(),
                                                                           path.name == "__init__.py")):
            found[name] = hits
    assert found == {}


@pytest.mark.parametrize("source", [
    "from aikit.runtime.Torch.engines.horovod import HOROVOD\n",
    "from aikit.runtime.Torch.engines import xla\n",
    "import aikit.runtime.Torch.engines.torch_distributed as td\n",
    "from .engines.single import SINGLE\n",
])
def test_a_planted_engine_import_is_found(source):
    assert len(engine_imports("aikit.runtime.Torch.planted", source)) == 1


@pytest.mark.parametrize("source", [
    'if distributed.engine() == "horovod":\n    pass\n',
    'if tensor.device.type == "xla":\n    pass\n',
    'where = "one process" if engine == "single" else engine\n',
    'ENGINES = ("torch.distributed",)\n',
])
def test_a_planted_engine_literal_is_found(source):
    assert len(engine_literals("aikit/planted.py", source)) == 1


# ---- Horovod's state handler: registered at explicit points, not at import ------------------


@pytest.mark.horovod
def test_importing_the_horovod_glue_leaves_horovods_handler_registry_alone(require_horovod):
    code = ("import horovod.torch as hvd\nfrom horovod.torch.elastic import state\n"
            "before = list(state.get_handler_registry())\nimport aikit.elastic.Torch.horovod\n"
            "assert state.get_handler_registry() == before, state.get_handler_registry()\n"
            "hvd.init()\nimport torch\nfrom aikit.ga.Torch.optim import Optimizer\n"
            "Optimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1), 2)\n"
            "assert state.get_handler_registry()[0][0] is Optimizer\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
