"""Several XLA replicas for real on XLA:CPU, in .venv-xla (torch 2.9.0 + torch_xla 2.9.0):

* eth-easl's multi-host scheme as two processes, each owning one XLA:CPU device, joined over
  gloo (MY_HOST_WORLD_SIZE=2): detection, a broadcast from replica 1, and training through a
  cycling random trace in which host 1 sits out some steps equal to single-process big-batch
  training, with compilations bounded after the first epoch and a mid-step resume;
* SPMD data parallel over 2 and 4 virtual CPU devices: global micro-batches sharded on the
  mesh's data axis, equal to single-process big-batch training, one micro-batch shape, bounded
  compilations, refusal of traces and plans that do not fill the mesh, and the GA wrapper.

The references are plain torch SGD on each step's whole global batch, on the CPU, here.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from ports import free_port
from test_xla import xla_python
from torch.utils.data import TensorDataset
from trace_common import MINIBATCH, big_batch_history, dataset, make_model, random_trace

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

pytestmark = [pytest.mark.xla, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SEED, EPOCHS, TIMEOUT = 5, 3, 400


def xla_env(**variables: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MY_", "XLA_"))}
    env.update(PJRT_DEVICE="CPU", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}",
               OMP_NUM_THREADS="1", **variables)
    return env


def float32_data() -> TensorDataset:
    x, y = dataset().tensors
    return TensorDataset(x.float(), y.float())


def params(result, prefix: str) -> list[torch.Tensor]:
    count = sum(1 for key in result.files if key.startswith(prefix + "_param"))
    return [torch.as_tensor(result[f"{prefix}_param{i}"]) for i in range(count)]


def reference_epochs(schedule: Schedule) -> list[list[torch.Tensor]]:
    """Parameters at the end of every epoch of plain big-batch SGD, float32 on the CPU."""
    plans = [schedule.epoch(e) for e in range(EPOCHS)]
    history = big_batch_history(make_model(seed=0).float(), plans, float32_data(), 0.05, 32, momentum=0.9,
                                weight_decay=1e-3)
    ends = np.cumsum([len(plan) for plan in plans]) - 1
    return [history[end] for end in ends]


def assert_float32_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)


def assert_each_sample_once(samples: np.ndarray, schedule: Schedule) -> None:
    for epoch in range(EPOCHS):
        plan = schedule.epoch(epoch)
        for step in range(len(plan)):
            got = samples[(samples[:, 0] == epoch) & (samples[:, 1] == step), 2]
            assert sorted(got.tolist()) == sorted(plan.step_indices(step).tolist()), (epoch, step)


# --- eth-easl's multi-host scheme: two real processes -------------------------------------------

@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    python, out, port = xla_python(), tmp_path_factory.mktemp("xla_hosts"), free_port()
    runs = [
        subprocess.Popen(
            [str(python), str(HERE / "xla_hosts_worker.py"), str(out), str(SEED)],
            env=xla_env(CPU_NUM_DEVICES="1", MY_HOST_WORLD_SIZE="2", MY_HOST_ORDINAL=str(host),
                        MY_DIST_ROOT=f"127.0.0.1:{port}"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        for host in range(2)
    ]
    try:
        outputs = [run.communicate(timeout=TIMEOUT)[0] for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    for host, (run, output) in enumerate(zip(runs, outputs, strict=True)):
        assert run.returncode == 0, f"host {host} exited {run.returncode}:\n{output[-4000:]}"
    return [np.load(out / f"host{host}.npz", allow_pickle=False) for host in range(2)]


def hosts_schedule() -> Schedule:
    return Schedule(Trace(random_trace(SEED, len(dataset())), "cycle"), len(dataset()), 2, MINIBATCH, SEED)


def test_hosts_are_detected_and_broadcast_and_sum_across_hosts(hosts):
    for host, result in enumerate(hosts):
        assert result["detected"].tolist() == [1, 2, host, 2]  # engine xla, 2 replicas, rank, devices
        assert result["sampler_world"].tolist() == [2, host]
        assert result["broadcast"].tolist() == [2.0, 2.0, 2.0, 20.0]  # replica 1's values
        assert result["all_reduce"].tolist() == [3.0, 4.0]


def test_hosts_train_like_one_process_on_the_big_batch(hosts):
    schedule = hosts_schedule()
    # the trace does leave host 1 without a micro-batch in some steps
    assert any(0 in schedule.epoch(e).counts(1) for e in range(EPOCHS))
    expected = reference_epochs(schedule)
    for epoch in range(EPOCHS):
        assert_float32_close(params(hosts[0], f"epoch{epoch}"), expected[epoch])
        for a, b in zip(params(hosts[0], f"epoch{epoch}"), params(hosts[1], f"epoch{epoch}"), strict=True):
            assert torch.equal(a, b)  # the same reduced gradient, the same update, on both hosts


def test_hosts_train_every_scheduled_sample_once_each_on_its_host(hosts):
    schedule = hosts_schedule()
    assert_each_sample_once(np.concatenate([result["samples"] for result in hosts]), schedule)
    for host, result in enumerate(hosts):  # and each host trained exactly its deal
        samples = result["samples"]
        for epoch in range(EPOCHS):
            plan = schedule.epoch(epoch)
            for step in range(len(plan)):
                got = samples[(samples[:, 0] == epoch) & (samples[:, 1] == step), 2].tolist()
                assert got == np.concatenate(plan.micro_batches(step, host) or [[]]).astype(int).tolist()


def test_hosts_compile_nothing_new_after_the_first_epoch(hosts):
    for result in hosts:
        compiles = result["compiles"].tolist()
        assert compiles[0] == compiles[-1] < int(result["updates"]), compiles


def test_hosts_resume_in_the_middle_of_a_step_to_the_same_parameters(hosts):
    for result in hosts:
        for a, b in zip(params(result, "resumed"), params(result, f"epoch{EPOCHS - 1}"), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


# --- SPMD: one process, 2 and 4 virtual CPU devices ----------------------------------------------

@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}-devices")
def spmd(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("xla_spmd") / "result.npz"
    done = subprocess.run([str(xla_python()), str(HERE / "xla_spmd_worker.py"), str(out), str(SEED)],
                          env=xla_env(CPU_NUM_DEVICES=str(request.param)), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return request.param, np.load(out, allow_pickle=False)


def spmd_schedule(result, devices: int) -> Schedule:
    return Schedule(Trace(result["trace"].tolist(), "cycle"), len(dataset()), 1, MINIBATCH * devices, SEED)


def test_spmd_is_one_replica_over_the_mesh_devices(spmd):
    devices, result = spmd
    assert result["detected"].tolist() == [1, 1, 0, devices, devices]  # xla, 1 replica, rank 0
    assert result["sampler"].tolist() == [1, 0, MINIBATCH, devices]
    # every micro-batch has one shape and is split over all devices along the batch dimension
    assert result["shapes"].tolist() == [[MINIBATCH * devices, 3]]
    assert f"devices=[{devices},1]" in str(result["sharding"])


def test_spmd_trains_like_one_process_on_the_big_batch(spmd):
    devices, result = spmd
    schedule = spmd_schedule(result, devices)
    assert_each_sample_once(result["samples"], schedule)
    for epoch, expected in enumerate(reference_epochs(schedule)):
        assert_float32_close(params(result, f"epoch{epoch}"), expected)


def test_spmd_compiles_nothing_new_after_the_first_epoch(spmd):
    _, result = spmd
    compiles = result["compiles"].tolist()
    assert compiles[0] == compiles[-1] < int(result["updates"]), compiles


def test_spmd_refuses_a_trace_or_plan_that_does_not_fill_the_mesh(spmd):
    devices, result = spmd
    unit = MINIBATCH * devices
    assert str(result["trace_error"]) == (
        f"trace list does not fill the {devices}-device SPMD mesh in every micro-step (a step that leaves a "
        "device without samples would need dummy samples):\n"
        f"  row 1 (step 1): batch size {unit + MINIBATCH} is not a multiple of minibatch_size x SPMD devices "
        f"({MINIBATCH} x {devices} =) {unit}; use {unit} or {2 * unit}"
    )
    below, above = {2: (12, 18), 4: (24, 36)}[devices]  # 3 GA steps of at most 4 per device
    assert str(result["plan_error"]) == (
        f"global_batch_size {2 * unit + 1} does not split evenly over the {devices} devices of the SPMD mesh "
        f"with at most {MINIBATCH} samples each (every device gets one shard of the same shape): use "
        f"global_batch_size {below} or {above}"
    )


def test_spmd_ga_wrapper_update_equals_the_big_batch_step(spmd):
    devices, result = spmd
    assert result["plan"].tolist() == [2, MINIBATCH, devices]  # steps, per-device batch, devices
    model = make_model(seed=0).float()
    x, y = float32_data().tensors
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.nn.functional.mse_loss(model(x[: 2 * MINIBATCH * devices]), y[: 2 * MINIBATCH * devices, :1]).backward()
    optimizer.step()
    assert_float32_close(params(result, "ga"), [p.detach() for p in model.parameters()])
