"""The parts of the XLA worlds that need no torch_xla (main .venv): eth-easl's host variables,
the SPMD trace check and its exact error, and that nothing is XLA unless torch_xla is imported.
The worlds themselves run in tests/trace/test_xla_replicas.py."""

import sys

import pytest

from aikit.core.trace import Trace
from aikit.elastic.Torch import distributed, spmd


def test_hosts_come_from_the_seed_variables_and_bad_values_are_named(monkeypatch):
    monkeypatch.delenv("MY_HOST_WORLD_SIZE", raising=False)
    monkeypatch.delenv("MY_HOST_ORDINAL", raising=False)
    assert distributed.hosts() == (1, 0)
    monkeypatch.setenv("MY_HOST_WORLD_SIZE", "4")
    monkeypatch.setenv("MY_HOST_ORDINAL", "3")
    assert distributed.hosts() == (4, 3)
    for count, host in (("2", "2"), ("0", "0"), ("two", "0"), ("2", "-1")):
        monkeypatch.setenv("MY_HOST_WORLD_SIZE", count)
        monkeypatch.setenv("MY_HOST_ORDINAL", host)
        with pytest.raises(ValueError) as raised:
            distributed.hosts()
        assert str(raised.value) == (
            f"MY_HOST_WORLD_SIZE={count!r} and MY_HOST_ORDINAL={host!r}: set them to the number of hosts (>= 1) "
            "and this host's index in 0..hosts-1"
        )


def test_spmd_micro_batch_is_minibatch_times_devices_and_refuses_steps_that_leave_a_device_empty():
    assert spmd.micro_batch(Trace([16, 48]), 16, 1) == 16  # no SPMD: the Schedule checks the trace
    assert spmd.micro_batch(Trace([32, 96]), 16, 2) == 32
    with pytest.raises(ValueError) as raised:
        spmd.micro_batch(Trace([64, 48, 16, 128], source="trace.csv"), 16, 4)
    assert str(raised.value) == (
        "trace trace.csv does not fill the 4-device SPMD mesh in every micro-step (a step that leaves a device "
        "without samples would need dummy samples):\n"
        "  row 1 (step 1): batch size 48 is not a multiple of micro_batch x SPMD devices (16 x 4 =) 64; use 64\n"
        "  row 2 (step 2): batch size 16 is not a multiple of micro_batch x SPMD devices (16 x 4 =) 64; use 64"
    )
    with pytest.raises(ValueError, match="micro_batch must be a positive integer, got 0"):
        spmd.micro_batch(Trace([64]), 0, 4)
    with pytest.raises(ValueError, match="minibatch_size must be a positive integer, got 0"):  # the name written
        spmd.micro_batch(Trace([64]), 0, 4, "minibatch_size")


def test_without_torch_xla_nothing_is_xla(monkeypatch):
    assert "torch_xla" not in sys.modules
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (distributed.engine(), distributed.world_size(), distributed.spmd_devices()) == ("single", 1, 1)
