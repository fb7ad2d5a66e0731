"""Sharded state: a model sharded with FSDP2, AdamW in the GA wrapper, kept by ElasticState through
DCP, on real gloo workers (torchrun, CPU, float64).

A run that loses its workers mid-update and goes on with another number of them (2 -> 1, 1 -> 2,
2 -> 3, the last a ragged plan) ends at the uninterrupted big-batch run's weights and AdamW state,
having trained every step once from where its last commit stood; the commit it went on from, read
in one process into a model that is not sharded, holds the big-batch run's state at that step. A
shard with one changed byte is caught on every rank, each warning the same, and the previous
commit restored. A commit killed while the shards are written leaves the previous commit,
restored without a warning.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from fsdp_common import adamw, data, model, reference, schedule, steps

from aikit.elastic.Torch import checkpoint
from aikit.elastic.Torch.resize import ElasticState
from aikit.ga.Torch.optim import Optimizer
from aikit.runtime.Torch import random_state

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
WORKER = HERE / "fsdp_worker.py"
STOP_AFTER = 3  # the first run commits 3 updates, then is lost one micro-step into the 4th


def run(torchrun, nproc: int, out: Path, name: str, *options: object) -> list[dict]:
    """One torchrun of the worker on ``nproc`` processes; what each rank saw."""
    torchrun(WORKER, out, out / "ckpt", name, *options, nproc=nproc, timeout=300)
    return [torch.load(out / f"{name}.rank{rank}.pt") for rank in range(nproc)]


def close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    return max(float((torch.as_tensor(got[k]).double() - want[k].double()).abs().max()) for k in want)


def restored_whole(ckpt: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The newest commit restored in this process, with no process group and no FSDP: a whole
    model and AdamW, which read every rank's shards. Its position, weights and AdamW state by
    name (as :func:`fsdp_common.reference` gives them)."""
    net = model(seed=9)
    opt = Optimizer(adamw(net.parameters()), steps=1, reduction="sum")
    state = ElasticState(ckpt, model=net, optimizer=opt, position={"epoch": 0, "step": 0}, verbose=False)
    rng = random_state.get_state()  # restore() sets the commit's streams: this process's go on after
    try:
        assert state.restore()
    finally:
        random_state.set_state(rng)
    names = {p: name for name, p in net.named_parameters()}
    adam = {f"{names[p]}.{key}": value for p, values in opt.state.items() for key, value in values.items()}
    return dict(state.position), net.state_dict(), adam


def check_steps(ranks: list[dict], expected: list[tuple[int, int]]) -> None:
    """The micro-batches the ranks trained are exactly the steps ``expected``, in order, each
    on its global batch: every sample once, dealt over the ranks."""
    plan = schedule()
    trained: dict[tuple[int, int], list[int]] = {}
    for rank in ranks:
        for epoch, step, _, _, index in rank["log"]:
            trained.setdefault((epoch, step), []).extend(index)
    assert sorted(trained) == sorted(expected)
    for epoch, step in expected:
        assert sorted(trained[epoch, step]) == sorted(plan.epoch(epoch).step_indices(step).tolist()), (epoch, step)


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3)], ids=["2to1", "1to2", "2to3"])
def test_a_sharded_run_resized_mid_update_equals_the_uninterrupted_run(tmp_path, torchrun, before, after):
    first = run(torchrun, before, tmp_path, "first", "--stop-after", STOP_AFTER)
    order = steps()
    position, weights, adam = restored_whole(tmp_path / "ckpt")  # and unsharded, in one process
    assert position == {"epoch": order[STOP_AFTER][0], "step": order[STOP_AFTER][1]}
    want_weights, want_adam = reference(STOP_AFTER)
    assert close(weights, want_weights) < 1e-9 and close(adam, want_adam) < 1e-9
    second = run(torchrun, after, tmp_path, "second", "--init-seed", 5)
    for rank in second:  # the restore: the last commit, where it stood in the trace
        assert rank["restored_from"]["commit"] == STOP_AFTER and rank["restored_from"]["world_size"] == before
        assert rank["position"] == {"epoch": order[STOP_AFTER][0], "step": order[STOP_AFTER][1]}
        assert rank["warnings"] == []
    weights, adam = reference()
    for rank in second:  # every rank gathers the same whole weights
        assert close(rank["final"], weights) < 1e-9
        assert close(rank["adam"], adam) < 1e-9
    assert second[0]["adam"]["0.weight.step"] == len(order)
    lost = order[STOP_AFTER]  # the update lost mid-way: trained in part by the first run, whole by the second
    assert any(tuple(entry[:2]) == lost for rank in first for entry in rank["log"])
    check_steps([dict(rank, log=[e for e in rank["log"] if tuple(e[:2]) != lost]) for rank in first],
                order[:STOP_AFTER])
    check_steps(second, order[STOP_AFTER:])
    if after == 3:  # 16 and 8 samples over 3 workers: micro-batches of two sizes in one step
        sizes = {}
        for rank in second:
            for epoch, step, _, _, index in rank["log"]:
                sizes.setdefault((epoch, step), set()).add(len(index))
        assert {3, 2} in sizes.values()


def test_a_replicated_commit_goes_on_sharded_each_rank_taking_its_part(tmp_path, torchrun):
    """A run that outgrew DDP: its commit (one process, a whole model) restored into FSDP2 on 2
    workers ends at the uninterrupted run's state, as if it had been sharded all along."""
    x, y = data()
    net = model()
    opt = Optimizer(adamw(net.parameters()), steps=1, reduction="sum")
    order, plan = steps(), schedule()
    state = ElasticState(tmp_path / "ckpt", model=net, optimizer=opt, position={}, verbose=False)
    for epoch, step in order[:STOP_AFTER]:  # the big-batch steps, one micro-step each
        window = torch.as_tensor(plan.epoch(epoch).step_indices(step))
        with opt.accumulate(net):
            ((net(x[window]) - y[window]) ** 2).sum().div(len(window)).backward()
        opt.step()
    state.position = {"epoch": order[STOP_AFTER][0], "step": order[STOP_AFTER][1]}
    state.commit()
    assert "sharded" not in checkpoint.read(checkpoint.commit_path(tmp_path / "ckpt", 1))
    sharded_on = run(torchrun, 2, tmp_path, "sharded", "--init-seed", 5)
    weights, adam = reference()
    for rank in sharded_on:
        assert rank["restored_from"]["commit"] == 1 and rank["restored_from"]["world_size"] == 1
        assert close(rank["final"], weights) < 1e-9 and close(rank["adam"], adam) < 1e-9
    check_steps(sharded_on, order[STOP_AFTER:])


def test_a_changed_byte_in_a_shard_is_caught_on_every_rank_and_the_previous_commit_restored(tmp_path, torchrun):
    run(torchrun, 2, tmp_path, "first", "--stop-after", 4)  # commits 3 and 4 kept
    shards = sorted(checkpoint.shard_directory(tmp_path / "ckpt", 4).iterdir())
    assert len(shards) == 2  # one file per rank
    victim = shards[1]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    victim.write_bytes(bytes(raw))
    again = run(torchrun, 3, tmp_path, "again", "--init-seed", 9)  # restored into another world, too
    warned = {tuple(rank["warnings"]) for rank in again}
    assert len(warned) == 1  # the same warning on every rank
    (message,) = warned.pop()
    assert f"shard {victim} is corrupt: the SHA-256 of its chunk of" in message
    assert f"restoring the previous commit {checkpoint.commit_path(tmp_path / 'ckpt', 3)}" in message
    for rank in again:
        assert rank["restored_from"]["commit"] == 3
    check_steps(again, steps()[3:])  # from where commit 3 stood
    weights, adam = reference()
    for rank in again:
        assert close(rank["final"], weights) < 1e-9 and close(rank["adam"], adam) < 1e-9


def test_sigkill_in_the_middle_of_a_sharded_commit_leaves_the_previous_commit(tmp_path, torchrun):
    command, env = torchrun.command(WORKER, tmp_path, tmp_path / "ckpt", "killed", "--pause-commit", 3)
    log = open(tmp_path / "killed.log", "w")  # noqa: SIM115  (open while the agent runs)
    agent = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    paused, deadline = tmp_path / "killed.paused", time.monotonic() + 240
    while not paused.exists() and agent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    for rank in range(2):  # the whole job goes: both workers and their agent
        os.kill(int((tmp_path / f"killed.pid{rank}").read_text()), signal.SIGKILL)
    agent.kill()
    agent.wait()
    log.close()
    assert paused.exists(), (tmp_path / "killed.log").read_text()[-3000:]
    ckpt = tmp_path / "ckpt"
    assert [n for n, _ in checkpoint.commit_files(ckpt)] == [2, 1]  # no marker for commit 3
    half = [p.name for p in checkpoint.shard_directory(ckpt, 3).iterdir()]
    assert len(half) == 1 and half[0].startswith("rank-00000.")  # rank 0 wrote its shard, rank 1 did not

    resumed = run(torchrun, 2, tmp_path, "resumed", "--init-seed", 7)
    for rank in resumed:
        assert rank["restored_from"]["commit"] == 2 and rank["warnings"] == []
    check_steps(resumed, steps()[2:])
    weights, _ = reference()
    assert close(resumed[0]["final"], weights) < 1e-9
    newest = checkpoint.commit_files(ckpt)[0][0]
    for number in (newest - 1, newest):  # the killed attempt's file is gone with its commit
        marker = checkpoint.read(checkpoint.commit_path(ckpt, number))
        assert sorted(p.name for p in checkpoint.shard_directory(ckpt, number).iterdir()) == sorted(
            marker["sharded"]["files"])
    assert sorted(p.name for p in ckpt.iterdir() if p.name.endswith(".shards")) == [
        checkpoint.shard_directory(ckpt, n).name for n in (newest - 1, newest)]


def test_a_sharded_run_that_forgot_restore_is_refused_on_every_rank_before_any_shard_is_written(tmp_path, torchrun):
    run(torchrun, 2, tmp_path, "first", "--stop-after", 2)  # commits 1 and 2
    ckpt = tmp_path / "ckpt"
    before = {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    forgot = run(torchrun, 2, tmp_path, "forgot", "--forget-restore")
    refusals = {rank["refused"] for rank in forgot}
    assert len(refusals) == 1  # the same words on every rank
    (message,) = refusals
    assert message.startswith(f"commit 1 would replace or delete commit(s) 1, 2 in {ckpt}, which this ElasticState "
                              "did not restore: call state.restore() before training to go on from them, pass "
                              "ElasticState(..., overwrite=True) to start over there")
    # not a shard written (a new file would be one), not a commit removed
    assert {p.relative_to(ckpt): p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == before
