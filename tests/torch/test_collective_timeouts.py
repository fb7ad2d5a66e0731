"""Every place aikit waits for its peers ends, when a peer stops answering, with a
:class:`~aikit.core.errors.CollectiveError` after about the timeout the user set, never a hang:
the trace optimizer's all-reduce, its first broadcast, the GA wrapper's bucketed all-reduce
(reduce=True), ``ElasticState.restore()``'s broadcast, and aikit's own gloo group of XLA hosts
(joining it and summing over it, ``AIKIT_HOST_TIMEOUT``). Two real gloo processes; the stuck
peer is stuck on purpose (tests/torch/stuck_peer_worker.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ports import free_port, free_ports

from aikit.core.errors import CollectiveError, InvalidValue
from aikit.runtime.Torch.engines.xla import host_timeout

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("stuck_peer_worker.py")
TIMEOUT = 2.0  # seconds: the process group's and AIKIT_HOST_TIMEOUT
SETTING = {"xla_hosts_join": "AIKIT_HOST_TIMEOUT", "xla_hosts_all_reduce": "AIKIT_HOST_TIMEOUT"}


def test_a_stuck_peer_ends_every_wait_of_aikit_with_a_named_error_within_the_timeout(torchrun, tmp_path):
    store_port, hosts_port = free_port(), free_ports(2, consecutive=True)[0]  # + 1: the second hosts' group
    out = tmp_path / "results.json"
    torchrun(WORKER, out, TIMEOUT, store_port, hosts_port, timeout=180)
    results = json.loads(out.read_text())
    assert set(results) == {"trace_step", "trace_join", "ga_reduce", "elastic_restore", "xla_hosts_join",
                            "xla_hosts_all_reduce"}
    for place, result in results.items():
        assert result["error"] == "CollectiveError", f"{place}: {result}"
        setting = SETTING.get(place, "init_process_group(timeout=...)")
        assert f"the wait is bounded by {setting}, {TIMEOUT:g} s here" in result["message"], result["message"]
        assert "no answer within the timeout" in result["message"], result["message"]
        assert TIMEOUT * 0.9 <= result["waited"] <= TIMEOUT + 5, f"{place} waited {result['waited']:.1f} s"
    print("\n" + "\n".join(f"{place}: {r['waited']:.2f} s" for place, r in results.items()))


def test_a_collective_error_is_a_runtime_error_of_aikit():
    assert issubclass(CollectiveError, RuntimeError)


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "ten"])
def test_a_bad_aikit_host_timeout_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv("AIKIT_HOST_TIMEOUT", value)
    with pytest.raises(InvalidValue, match=f"AIKIT_HOST_TIMEOUT={value!r} must be a number of seconds > 0"):
        host_timeout()


def test_aikit_host_timeout_sets_the_xla_hosts_wait(monkeypatch):
    monkeypatch.delenv("AIKIT_HOST_TIMEOUT", raising=False)
    assert host_timeout().total_seconds() == 1800
    monkeypatch.setenv("AIKIT_HOST_TIMEOUT", "2.5")
    assert host_timeout().total_seconds() == 2.5
