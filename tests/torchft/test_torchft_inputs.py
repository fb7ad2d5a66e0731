"""aikit on TorchFT in this process (seconds): one replica group on an in-process lighthouse
trains the big-batch run exactly on both paths; what a group heals from is commit bytes, never
unpickled; the UpdateSampler deals every update whole over any number of groups; and every bad
input gets its named error in time: torchft missing (the extra named), a lighthouse that refuses
or never answers, fewer groups than min_replicas, a group of several processes, objects a
ReplicaGroup cannot train, a collective outside an update."""

from __future__ import annotations

import pickle
import socket
import sys
import time
from datetime import timedelta

import ft_common as common
import numpy as np
import pytest
import torch

from aikit.core.errors import CheckpointError, CollectiveError, InvalidState, InvalidValue, TrainingFailed
from aikit.elastic.Torch import CustomSampler, ElasticState, LinearRuleOptimizer
from aikit.elastic.Torch.fault_tolerance import ReplicaGroup
from aikit.elastic.Torch.heal_transport import CommitTransport
from aikit.elastic.Torch.update_sampler import UpdateSampler
from aikit.ga.Torch.optim import Optimizer
from aikit.runtime.Torch import collectives, distributed, random_state

pytestmark = pytest.mark.torchft


def trace_state(directory) -> tuple[torch.nn.Module, ElasticState]:
    net = common.model()
    sampler = CustomSampler(common.SAMPLES, common.TRACE, micro_batch=common.MICRO, seed=common.SEED,
                            when_exhausted="cycle")
    optimizer = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=common.LR, momentum=common.MOMENTUM), sampler,
                                    ref_batch_size=common.REF_BATCH)
    return net, ElasticState(directory, model=net, optimizer=optimizer, verbose=False)


def ga_state(directory, **options) -> tuple[torch.nn.Module, ElasticState]:
    net = common.model()
    sgd = torch.optim.SGD(net.parameters(), lr=common.LR, momentum=common.MOMENTUM)
    optimizer = Optimizer(sgd, 1, **{"reduce": True, "global_batch_size": common.GLOBAL_BATCH, **options})
    samples = UpdateSampler(common.SAMPLES, common.GLOBAL_BATCH, common.MAX_DEVICE_BATCH, seed=common.SEED)
    return net, ElasticState(directory, model=net, optimizer=optimizer, samples=samples, verbose=False)


def group(state: ElasticState, address: str, **options) -> ReplicaGroup:
    settings = {"replica_id": "solo", "host": "127.0.0.1", "timeout_s": 5, "quorum_timeout_s": 10, "verbose": False}
    return ReplicaGroup(state, address, **{**settings, **options})


@pytest.mark.parametrize("path", ["trace", "ga"])
def test_one_group_alone_trains_the_big_batch_run(tmp_path, lighthouse, path):
    net, state = (trace_state if path == "trace" else ga_state)(tmp_path)
    x, y = common.data()
    params = []
    with group(state, lighthouse.address, on_update=lambda g, committed: params.append(common.flat(net))) as solo:
        assert (distributed.engine(), distributed.world_size()) == ("torchft", 1)
        for _ in solo.epochs(2):
            for indices in solo.micro_batches():
                loss = torch.nn.functional.cross_entropy(net(x[indices]), y[indices])
                optimizer = state.optimizer if path == "trace" else state._objects["optimizer"]
                if path == "ga":
                    with optimizer.accumulate(samples=len(indices)):
                        loss.backward()
                else:
                    loss.backward()
                optimizer.step()
        assert (solo.committed, solo.aborted, solo.updates) == (len(params), 0, len(params))
    assert distributed.engine() == "single"  # stop() left the replica groups
    reference = common.reference(path, 2)
    assert len(params) == len(reference)
    assert max(common.worst_difference(p, row["params"]) for p, row in zip(params, reference, strict=True)) < 1e-12


def test_without_torchft_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)
    monkeypatch.setitem(sys.modules, "torchft.manager", None)
    _, state = trace_state(tmp_path)
    with pytest.raises(ModuleNotFoundError, match=r"needs TorchFT \(module 'torchft'\), which is not installed: "
                                                  r"pip install 'aikit-elastic\[torchft\]'"):
        group(state, "http://127.0.0.1:1").start()


def test_a_lighthouse_that_refuses_is_named_within_its_timeout(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    _, state = trace_state(tmp_path)
    started = time.monotonic()
    with pytest.raises(CollectiveError, match=rf"the TorchFT lighthouse at http://127.0.0.1:{port} cannot be reached "
                                              r"within quorum_timeout_s=2: .*Start it \(torchft_lighthouse"):
        group(state, f"http://127.0.0.1:{port}", quorum_timeout_s=2).start()
    assert time.monotonic() - started < 15


def test_a_lighthouse_that_never_answers_is_named_within_the_quorum_timeout(tmp_path):
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never says a word
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    _, state = trace_state(tmp_path)
    started = time.monotonic()
    solo = group(state, f"http://127.0.0.1:{silent.getsockname()[1]}", quorum_timeout_s=2)
    try:
        with pytest.raises(CollectiveError, match=r"(cannot be reached within quorum_timeout_s=2|no TorchFT quorum "
                                                  r"from the lighthouse at .* \(quorum_timeout_s=2\))"):
            solo.start()
            next(solo.epochs(1))
    finally:
        solo.stop()
        silent.close()
    assert time.monotonic() - started < 20


def test_fewer_groups_than_min_replicas_train_nothing_and_are_refused_after_the_quorum_timeout(tmp_path, lighthouse):
    net, state = trace_state(tmp_path)
    before = common.flat(net)
    started = time.monotonic()
    refusal = (r"only 1 TorchFT replica group\(s\) in the quorum, fewer than min_replicas=2, for 2 s "
               r"\(quorum_timeout_s\): start more groups")
    with group(state, lighthouse.address, min_replicas=2, quorum_timeout_s=2) as solo, pytest.raises(
            TrainingFailed, match=refusal):
        for _ in solo.epochs(1):
            pass
    assert 2 <= time.monotonic() - started < 20
    assert common.flat(net) == before and solo.committed == 0


def test_a_group_of_several_processes_is_refused_by_name(tmp_path, lighthouse, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    _, state = trace_state(tmp_path)
    with pytest.raises(InvalidValue, match=r"this replica group has 2 processes .*: aikit trains TorchFT replica "
                                           r"groups of one process each so far; start one process per group"):
        group(state, lighthouse.address).start()


def test_what_a_replica_group_cannot_train_is_refused_when_it_is_built(tmp_path, monkeypatch):
    net, state = trace_state(tmp_path)
    only_model = ElasticState(tmp_path, model=net)
    with pytest.raises(InvalidValue, match=r"keep one trace optimizer, or one GA Optimizer and one UpdateSampler"):
        group(only_model, "http://127.0.0.1:1")
    with pytest.raises(InvalidValue, match=r"build it with reduce=True and train the plain model"):
        group(ga_state(tmp_path, reduce=False)[1], "http://127.0.0.1:1")
    with pytest.raises(InvalidValue, match=r"give Optimizer\(\.\.\., global_batch_size=25\)"):
        group(ga_state(tmp_path, global_batch_size=24)[1], "http://127.0.0.1:1")
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(InvalidValue, match=r"needs the lighthouse's address"):
        group(state, None)
    with pytest.raises(InvalidValue, match=r"timeout_s must be a positive number of seconds, got 0"):
        group(state, "http://127.0.0.1:1", timeout_s=0)
    with pytest.raises(InvalidValue, match=r"min_replicas must be a positive integer, got 0"):
        group(state, "http://127.0.0.1:1", min_replicas=0)


def test_a_collective_outside_an_update_is_refused_not_hung(tmp_path, lighthouse):
    _, state = trace_state(tmp_path)
    with group(state, lighthouse.address):
        with pytest.raises(InvalidState, match=r"needs the update's quorum first: .*ReplicaGroup.micro_batches\(\)"):
            collectives.all_reduce_sum_([torch.ones(3)])
        with pytest.raises(InvalidState, match=r"needs the update's quorum first"):
            collectives.commit()


def test_a_heal_fetches_commit_bytes_and_never_unpickles_them(monkeypatch):
    state = {"user": {"aikit": {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "rng": random_state.get_state(),
                                "position": (3, [1, 2]), "name": "run"}},
             "torchft": {"step": 7, "batches_committed": 14}}
    # the sender holds a request for a step it has not made for its 0.5 s, well inside the fetch's
    # 5 s: a step it will never serve gets its 404, not the fetch's own timeout (a loaded machine)
    sender, receiver = CommitTransport("127.0.0.1", timedelta(seconds=0.5)), CommitTransport("127.0.0.1",
                                                                                             timedelta(seconds=5))
    try:
        sender.send_checkpoint([1], 7, state, timedelta(seconds=5))
        for unpickler in (pickle, torch):  # a heal that unpickled anything would fail here
            monkeypatch.setattr(unpickler, "loads" if unpickler is pickle else "load", _refuse)
        monkeypatch.setattr(pickle, "load", _refuse)
        got = receiver.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=5))
        assert got["torchft"] == {"step": 7, "batches_committed": 14} and got["user"]["aikit"]["name"] == "run"
        assert torch.equal(got["user"]["aikit"]["model"]["w"], state["user"]["aikit"]["model"]["w"])
        assert got["user"]["aikit"]["position"] == (3, [1, 2])
        assert np.array_equal(got["user"]["aikit"]["rng"]["numpy"][1], state["user"]["aikit"]["rng"]["numpy"][1])
        step, raw = sender._served
        sender._served = step, raw[:-1] + bytes([raw[-1] ^ 1])  # one changed bit on the way
        with pytest.raises(CheckpointError, match="is corrupt: its SHA-256 does not match"):
            receiver.recv_checkpoint(0, sender.metadata(), 7, timedelta(seconds=5))
        sender.disallow_checkpoint()  # the update decided: nothing served any more
        with pytest.raises(CheckpointError, match="could not be fetched: HTTP Error 404"):
            receiver.recv_checkpoint(0, sender.metadata(), 6, timedelta(seconds=5))
    finally:
        sender.shutdown()
        receiver.shutdown()


def _refuse(*args, **kwargs):
    raise AssertionError("a heal unpickled what another process sent")


@pytest.mark.parametrize("replicas", range(1, 8))
def test_the_update_sampler_deals_every_update_whole_to_any_number_of_groups(replicas):
    sampler = UpdateSampler(common.SAMPLES, common.GLOBAL_BATCH, common.MAX_DEVICE_BATCH, seed=common.SEED)
    for _ in range(sampler.updates_per_epoch):
        window = sampler.window()
        dealt = [sampler.micro_batches(replicas, rank) for rank in range(replicas)]
        assert len({len(parts) for parts in dealt}) == 1, "every group makes the plan's GA steps"
        assert all(len(part) <= common.MAX_DEVICE_BATCH for parts in dealt for part in parts)
        merged = np.concatenate([part for parts in dealt for part in parts])
        assert sorted(merged.tolist()) == sorted(window.tolist()) and len(merged) == common.GLOBAL_BATCH
        sizes = [sum(len(part) for part in parts) for parts in dealt]
        assert max(sizes) - min(sizes) <= len(dealt[0]), "an even deal, up to a sample a GA step"
        sampler.advance()
    assert sampler.done and sampler.update == common.SAMPLES // common.GLOBAL_BATCH


def test_the_update_sampler_resumes_its_position_and_refuses_another_runs():
    sampler = UpdateSampler(common.SAMPLES, common.GLOBAL_BATCH, common.MAX_DEVICE_BATCH, seed=common.SEED)
    sampler.set_epoch(1)
    sampler.advance()
    again = UpdateSampler(common.SAMPLES, common.GLOBAL_BATCH, common.MAX_DEVICE_BATCH, seed=common.SEED)
    again.load_state_dict(sampler.state_dict())
    again.set_epoch(1)  # the epoch in progress keeps its position
    assert (again.epoch, again.update) == (1, 1) and np.array_equal(again.window(), sampler.window())
    other = UpdateSampler(common.SAMPLES, common.GLOBAL_BATCH, common.MAX_DEVICE_BATCH, seed=8)
    with pytest.raises(InvalidValue, match=r"deals other samples: seed 7 \(this sampler: 8\)"):
        other.load_state_dict(sampler.state_dict())
    assert (other.epoch, other.update) == (0, 0)


def test_the_lr_finder_runs_before_the_group_starts_and_is_refused_by_name_after(tmp_path, lighthouse):
    from aikit.autolrs.Torch import AutoLRS
    from aikit.lr_finder.Torch import LRFinder

    net, state = trace_state(tmp_path)
    x, y = common.data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    finder = LRFinder(net, torch.optim.SGD(net.parameters(), lr=1e-3), torch.nn.CrossEntropyLoss())
    finder.range_test(loader, end_lr=1, num_iter=6, progress_bar=False)  # before group.start(): one process
    assert len(finder.history["lr"]) == 6
    finder.reset()
    autolrs = AutoLRS(net, state.optimizer.optimizer, lambda: 1.0, 1e-3, 1.0)
    with group(state, lighthouse.address):
        with pytest.raises(InvalidState, match=r"run the range test before group.start\(\)"):
            finder.range_test(loader, end_lr=1, num_iter=6, progress_bar=False)
        with pytest.raises(InvalidState, match=r"AutoLRS under TorchFT's replica groups: its trials and rollbacks"):
            autolrs.on_train_batch_end(1.0)
