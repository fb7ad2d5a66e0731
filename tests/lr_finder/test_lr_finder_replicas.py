"""The torch LRFinder on 2 real processes, under each engine aikit detects: DDP under torchrun
(gloo), an FSDP2 model under torchrun, Horovod's DistributedOptimizer under horovodrun (gloo),
and two XLA:CPU hosts in eth-easl's scheme (.venv-xla). Every rank uses rank 0's LRs and records
the rank-averaged loss, so every rank stops together; one plot, one CSV; reset() restores the
start; and Horovod and FSDP2 record what DDP records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from ports import free_port
from test_xla import xla_python
from test_xla_replicas import ROOT, xla_env

WORKER = Path(__file__).with_name("lr_finder_replicas_worker.py")
ENGINES = ["torchrun", "torchrun_fsdp2", pytest.param("horovodrun", marks=pytest.mark.horovod)]
XLA = pytest.param("xla_hosts", marks=pytest.mark.xla)
pytestmark = pytest.mark.slow


def xla_hosts(script: Path, out: Path, engine: str) -> None:
    """Two XLA:CPU hosts of eth-easl's scheme, each a process of .venv-xla's python."""
    python, port = xla_python(), free_port()
    runs = [subprocess.Popen([str(python), str(script), str(out), engine], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=xla_env(CPU_NUM_DEVICES="1", MY_HOST_WORLD_SIZE="2", MY_HOST_ORDINAL=str(host),
                                         MY_DIST_ROOT=f"127.0.0.1:{port}"))
            for host in range(2)]
    try:
        outputs = [run.communicate(timeout=300)[0] for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    for host, (run, output) in enumerate(zip(runs, outputs, strict=True)):
        assert run.returncode == 0, f"host {host} exited {run.returncode}:\n{output[-4000:]}"



@pytest.fixture(scope="module")
def launched() -> dict:
    """Each engine's run, launched once for the module: ``{launcher: (out, [rank0, rank1])}``."""
    return {}


def launch(launcher: str, request, tmp_path_factory, launched: dict) -> tuple[Path, list[dict]]:
    if launcher not in launched:
        out = tmp_path_factory.mktemp(f"lr_finder_{launcher}")
        if launcher == "xla_hosts":
            xla_hosts(WORKER, out, "xla")
        elif launcher == "torchrun_fsdp2":
            request.getfixturevalue("torchrun")(WORKER, out, "fsdp")
        else:
            request.getfixturevalue(launcher)(WORKER, out, *(["horovod"] if launcher == "horovodrun" else []))
        launched[launcher] = out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return launched[launcher]


@pytest.fixture(scope="module", params=ENGINES)
def ranks(request, tmp_path_factory, launched) -> tuple[Path, list[dict]]:
    """Each launcher's run; the tests that do not plot take XLA's too (``indirect``)."""
    return launch(request.param, request, tmp_path_factory, launched)


@pytest.mark.parametrize("name", ["train", "val"])
@pytest.mark.parametrize("ranks", [*ENGINES, XLA], indirect=True)
def test_every_rank_steps_through_rank_0s_lrs(ranks, name):
    _, results = ranks
    lrs = [r[name]["history"]["lr"] for r in results]
    assert lrs[0] == lrs[1]
    assert lrs[0][0] == 1e-4  # rank 1's optimizer said 1e-3
    assert lrs[0][-1] == pytest.approx(0.1, rel=1e-12)
    assert results[0][name]["step_lrs"] == results[1][name]["step_lrs"] == lrs[0]


@pytest.mark.parametrize("ranks", [*ENGINES, XLA], indirect=True)
def test_the_training_loss_is_the_mean_over_ranks_of_each_ranks_update_loss(ranks):
    _, results = ranks
    per_rank = []
    for r in results:
        losses = [c["loss"] for c in r["train"]["calls"]]
        assert len(losses) == 12  # 6 iterations x 2 micro-batches
        per_rank.append([(a + b) / 2 for a, b in zip(losses[::2], losses[1::2], strict=True)])
    expected = [(a + b) / 2 for a, b in zip(*per_rank, strict=True)]
    assert per_rank[0] != per_rank[1]  # the ranks did see different data
    for r in results:
        assert r["train"]["history"]["loss"] == pytest.approx(expected, rel=1e-6)
    assert results[0]["train"]["history"]["loss"] == results[1]["train"]["history"]["loss"]


@pytest.mark.parametrize("ranks", [*ENGINES, XLA], indirect=True)
def test_the_validation_loss_is_the_mean_over_every_ranks_samples(ranks):
    _, results = ranks
    totals = [[0.0, 0] for _ in range(6)]
    for r in results:
        passes = [c for c in r["val"]["calls"] if not c["training"]]
        per_pass = len(passes) // 6
        for i in range(6):
            for call in passes[i * per_pass:(i + 1) * per_pass]:
                totals[i][0] += call["loss"] * call["samples"]
                totals[i][1] += call["samples"]
    assert [count for _, count in totals] == [16] * 6
    expected = [loss / count for loss, count in totals]
    for r in results:
        assert r["val"]["history"]["loss"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("ranks", [*ENGINES, XLA], indirect=True)
def test_the_engine_keeps_the_ranks_weights_equal(ranks):
    _, results = ranks
    assert results[0]["train"]["weights"] == results[1]["train"]["weights"]


def test_only_the_master_draws_and_writes_but_every_rank_gets_the_suggestion(ranks):
    out, results = ranks
    assert [r["train"]["drew"] for r in results] == [True, False]
    assert results[0]["train"]["suggested"] == results[1]["train"]["suggested"]
    ga = ["ga_rank0.csv"] if "ga" in results[0] else []  # (the GA scenario runs under torchrun)
    assert sorted(p.name for p in out.glob("*.csv")) == [*ga, "train_rank0.csv", "val_rank0.csv"]


@pytest.mark.horovod
@pytest.mark.parametrize("name", ["train", "val"])
def test_horovod_records_what_torchrun_records(request, tmp_path_factory, launched, name):
    """The same LRs, losses and weights to the bit: Horovod is detected, not run as two lone
    processes. (Bit for bit, as DDP's mean of two gradients, a/2 + b/2, and Horovod's, (a + b)/2,
    round alike: halving is exact in binary floating point.)"""
    torchrun = launch("torchrun", request, tmp_path_factory, launched)[1]
    horovod = launch("horovodrun", request, tmp_path_factory, launched)[1]
    for a, b in zip(torchrun, horovod, strict=True):
        assert b[name]["history"] == a[name]["history"]
        assert b[name]["weights"] == a[name]["weights"]


@pytest.mark.parametrize("name", ["train", "val"])
@pytest.mark.parametrize("ranks", ENGINES, indirect=True)
def test_reset_puts_the_starting_weights_back(ranks, name):
    _, results = ranks
    assert [r[name]["reset_to_start"] for r in results] == [True, True]


def test_fsdp2_reduce_scatters_once_per_update_not_per_micro_batch(request, tmp_path_factory, launched):
    """accumulation_steps=2: the first micro-batch's backward skips FSDP2's reduce-scatter
    (aikit.runtime.Torch.gradient_sync), the second's reduce-scatters (criterion calls 2, 4, ...)."""
    fsdp = launch("torchrun_fsdp2", request, tmp_path_factory, launched)[1]
    for rank in fsdp:
        assert rank["train"]["reduce_scatters"] == [2, 4, 6, 8, 10, 12]


@pytest.mark.parametrize("name", ["train", "val"])
def test_fsdp2_records_what_ddp_records(request, tmp_path_factory, launched, name):
    ddp = launch("torchrun", request, tmp_path_factory, launched)[1]
    fsdp = launch("torchrun_fsdp2", request, tmp_path_factory, launched)[1]
    for a, b in zip(ddp, fsdp, strict=True):
        assert b[name]["history"]["lr"] == a[name]["history"]["lr"]
        assert b[name]["history"]["loss"] == pytest.approx(a[name]["history"]["loss"], rel=1e-12)
        for got, want in zip(b[name]["weights"], a[name]["weights"], strict=True):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_a_ddp_range_test_through_aikits_ga_optimizer_equals_the_finders_own_accumulation(request, tmp_path_factory,
                                                                                          launched):
    """DDP, 2 ranks, GA(SGD, 2): each update is 2 micro-batches (DDP skips the first one's
    all-reduce), at rank 0's LR, recording the loss averaged over the ranks; the same history
    and weights as the finder's own accumulation_steps=2 (issue 27)."""
    _, results = launch("torchrun", request, tmp_path_factory, launched)
    for r in results:
        assert len(r["ga"]["calls"]) == 12 and r["ga"]["step_lrs"] == r["ga"]["history"]["lr"]  # one step an update
        assert r["ga"]["history"]["lr"] == r["train"]["history"]["lr"]
        assert r["ga"]["history"]["loss"] == pytest.approx(r["train"]["history"]["loss"], rel=1e-12)
        for a, b in zip(r["ga"]["weights"], r["train"]["weights"], strict=True):
            assert a == pytest.approx(b, rel=1e-12, abs=1e-14)
    assert results[0]["ga"]["weights"] == results[1]["ga"]["weights"]
