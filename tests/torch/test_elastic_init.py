"""aikit.elastic.Torch.init: the device count from where the script runs, the core plan, and
clear errors."""

from __future__ import annotations

import pytest

import aikit.elastic
import aikit.elastic.Torch as elastic
from aikit.core.errors import InvalidValue
from aikit.core.plan import make_plan
from aikit.elastic.Torch import distributed

TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)


def gpus_found(monkeypatch, count: int) -> None:
    """A one-process machine with ``count`` GPUs, as aikit's detection sees it (this CPU machine
    has none; ``init`` plans only the devices it finds)."""
    monkeypatch.setattr(distributed, "device_count", lambda: count)


def torchrun_env(monkeypatch, world: int, rank: int) -> None:
    """The variables torchrun sets before the script has called init_process_group."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


def test_seed_002_example_on_one_cpu_process():
    plan = elastic.init(256, 64)
    assert distributed.engine() == "single" and distributed.device_count() == 1
    assert (elastic.steps, elastic.batch_size, elastic.global_batch_size, elastic.gpus, elastic.master) == (
        4, 64, 256, 1, True)
    assert plan == make_plan(256, 64, 1)
    assert aikit.elastic.steps == 4  # also readable where seed 002's README reads it
    assert aikit.elastic.plan is plan is elastic.plan  # docs/torch.md: the plan too


def test_aikit_elastic_answers_with_the_latest_init():
    """After a PyTorch init, aikit.elastic has no Keras strategy (not one left by an earlier
    Keras init), and says which init sets it."""
    plan = elastic.init(96, 32)
    assert aikit.elastic.plan is plan and aikit.elastic.steps == 3
    with pytest.raises(AttributeError, match=r"aikit.elastic.strategy is set by aikit.elastic.TF.init\(...\)"):
        aikit.elastic.strategy  # noqa: B018


@pytest.mark.parametrize(("gpus", "steps"), [(1, 4), (2, 2), (4, 1)])
def test_seed_002_table(monkeypatch, gpus, steps):
    """Seed 002's table: GA steps by the GPUs available, found by init or picked with gpus=."""
    gpus_found(monkeypatch, gpus)
    elastic.init(256, 64)
    assert (elastic.steps, elastic.gpus, elastic.batch_size) == (steps, gpus, 64)
    gpus_found(monkeypatch, 4)
    elastic.init(256, 64, gpus=gpus)  # DataParallel on some of the GPUs
    assert (elastic.steps, elastic.gpus, elastic.batch_size) == (steps, gpus, 64)


def test_more_gpus_than_this_machine_has_are_refused_naming_the_plan_for_another_machine(monkeypatch):
    """init plans the machine it runs on (as Keras' init does): a count it does not have would
    give each device more than max_device_batch; aikit plan and make_plan plan other machines."""
    for gpus in (4, 10**18):
        with pytest.raises(ValueError) as raised:
            elastic.init(256, 64, gpus=gpus)
        assert str(raised.value) == (
            f"gpus={gpus} but only 1 device(s) can be used here (one process): pass gpus=1 or fewer, or leave gpus "
            f"out; init plans the machine it runs on, so for a machine with {gpus} devices run `aikit plan "
            f"--global-batch-size 256 --max-device-batch 64 --gpus {gpus}` or call "
            f"aikit.core.plan.make_plan(256, 64, {gpus})")
    gpus_found(monkeypatch, 2)
    with pytest.raises(ValueError, match=r"gpus=3 but only 2 device\(s\) can be used here"):
        elastic.init(256, 64, gpus=3)


def test_three_devices_get_exact_ragged_micro_batches(monkeypatch):
    gpus_found(monkeypatch, 3)
    plan = elastic.init(256, 64, gpus=3)
    assert plan.micro_batch_sizes == ((43, 43, 43), (43, 42, 42))
    assert elastic.batch_size == 43 <= 64
    assert "step 1: [43, 42, 42]" in elastic.summary() and "engine: single" in elastic.summary()


def test_torchrun_environment_sets_devices_and_master(monkeypatch):
    torchrun_env(monkeypatch, world=2, rank=1)
    assert (distributed.engine(), distributed.world_size(), distributed.rank(), distributed.local_rank()) == (
        "torch.distributed", 2, 1, 1)
    elastic.init(256, 64)
    assert (elastic.gpus, elastic.steps, elastic.master) == (2, 2, False)


def test_gpus_that_disagree_with_the_process_count_are_refused(monkeypatch):
    torchrun_env(monkeypatch, world=2, rank=0)
    with pytest.raises(ValueError, match=r"gpus=3 but this run has 2 processes \(torch.distributed\): every "
                                         r"process is one device, so leave gpus=None or launch 3 processes"):
        elastic.init(256, 64, gpus=3)


def test_a_plan_that_leaves_a_process_idle_is_refused(monkeypatch):
    torchrun_env(monkeypatch, world=3, rank=0)
    with pytest.raises(ValueError, match=r"the plan uses 2 of the 3 processes \(policy 'fewer_devices'.*: launch 2 "
                                         r"processes or use policy 'ragged'$"):
        elastic.init(256, 64, policy="fewer_devices")


@pytest.mark.parametrize("policy", ["ragged", "fewer_devices"])
def test_a_global_batch_below_the_process_count_names_the_fix_that_helps(monkeypatch, policy):
    """Issue 47: init(1, ...) on 2 processes told the user to use policy 'ragged', which it was
    already, and which cannot give 2 processes a sample each of 1."""
    torchrun_env(monkeypatch, world=2, rank=0)
    with pytest.raises(InvalidValue) as refused:
        elastic.init(1, 4, policy=policy)
    assert str(refused.value) == (
        f"the plan uses 1 of the 2 processes (policy {policy!r}, global_batch_size 1), but every process of a "
        "torch.distributed run must train on at least one sample per update: use global_batch_size 2 or more, or "
        "launch 1 process")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 64), "global_batch_size must be a positive integer, got 0"),
        ((256, -1), "max_device_batch must be a positive integer, got -1"),
        ((256, 64, 0), "gpus must be a positive integer, got 0"),
        ((256, 64, 2.0), "gpus must be a positive integer, got 2.0"),
        ((100, 30, 1, "even"), r"policy must be one of \('ragged', 'fewer_devices', 'error'\), got 'even'"),
    ],
)
def test_bad_input_gets_a_clear_error(args, message):
    with pytest.raises(ValueError, match=message):
        elastic.init(*args)


def test_bad_torchrun_variable_is_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match=r"environment variable WORLD_SIZE='two' is not an integer"):
        elastic.init(256, 64)
