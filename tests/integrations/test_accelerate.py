"""aikit's Accelerate integration trains exactly as the same training written by hand (float64,
CPU, the real Accelerate): the global batch kept when out-of-memory errors force the per-device
batch down (128 -> 64 -> 32 per device, GA 1 -> 2 -> 4, where Accelerate's own back-off goes to
115 and its example's GA to a global batch of 115), and a token-weighted mean exact across
micro-batches. The two-process run (torchrun, gloo) sums the counts across processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate_case import EPOCHS, GLOBAL_BATCH, OOM, UPDATES, Net, by_hand, data, optimizer, token_weighted
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import find_executable_batch_size  # noqa: E402

from aikit.core.errors import InvalidType, InvalidValue, SmallSplitWarning, TrainingFailed  # noqa: E402
from aikit.integrations.accelerate import GlobalBatch  # noqa: E402

WORKER = Path(__file__).with_name("accelerate_worker.py")


@pytest.fixture
def accelerator() -> Accelerator:
    return Accelerator(cpu=True)


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-10, atol=1e-12)


def test_back_off_keeps_the_global_batch_where_accelerate_loses_it(accelerator):
    tried = []

    def step(batch_size):
        tried.append(batch_size)
        if batch_size > 40:
            raise RuntimeError(OOM.format(batch_size))
        return batch_size

    found = find_executable_batch_size(step, starting_batch_size=GLOBAL_BATCH)()  # Accelerate's 0.9
    assert (found, GLOBAL_BATCH // found * found) == (36, 108)  # its example's GA: 3 steps of 36, not 128
    global_batch, tried = GlobalBatch(accelerator, GLOBAL_BATCH), []
    assert global_batch.find_executable_batch_size(step)() == 32
    assert tried == [128, 64, 32] and global_batch.tried == [128, 64]
    assert (global_batch.steps, accelerator.gradient_accumulation_steps) == (4, 4)


def test_mean_loss_through_accumulate_trains_as_big_batches_after_out_of_memory(accelerator):
    """The user's loop with Accelerate's accumulate(): GA from the plan found, exact."""
    global_batch = GlobalBatch(accelerator, GLOBAL_BATCH, max_device_batch=100)
    assert global_batch.device_batch == 64  # the largest even plan's batch under 100

    @global_batch.find_executable_batch_size
    def train(device_batch):
        accelerator.free_memory()
        model = Net(fits=20)
        opt = optimizer(model)
        loader = DataLoader(TensorDataset(*data(ignore=False)), batch_size=device_batch, drop_last=True)
        prepared, opt, loader = accelerator.prepare(model, opt, loader)
        for _ in range(EPOCHS):
            for x, y in loader:
                with accelerator.accumulate(prepared):
                    accelerator.backward(nn.functional.cross_entropy(prepared(x), y))
                    opt.step()
                    opt.zero_grad()
        return model

    model = train()
    assert global_batch.tried == [64, 32] and (global_batch.device_batch, global_batch.steps) == (16, 8)
    assert model.sizes == [16] * (EPOCHS * UPDATES * 8)  # the model of the try that fitted
    assert_same_weights(model, by_hand(ignore=False))


def test_token_weighted_updates_train_as_big_batches(accelerator):
    global_batch = GlobalBatch(accelerator, GLOBAL_BATCH, max_device_batch=32)
    global_batch.use(32)
    totals = []
    model = token_weighted(accelerator, global_batch, 32, totals=totals)
    _, y = data()
    assert [int(t) for t in totals[:UPDATES]] == [int((y[i:i + 128] != -100).sum()) for i in range(0, 640, 128)]
    assert all(t.dtype == torch.int64 for t in totals)  # a count on the device, never read by aikit
    assert_same_weights(model, by_hand())

    mean_of_means, (x, y) = Net(), data()  # the bug the counts avoid: each micro-batch's own mean, averaged
    opt = optimizer(mean_of_means)
    for _ in range(EPOCHS):
        for start in range(0, len(y), 32):
            logits, labels = mean_of_means(x[start:start + 32]), y[start:start + 32]
            (nn.functional.cross_entropy(logits, labels, ignore_index=-100) / 4).backward()
            if start % 128 == 96:
                opt.step()
                opt.zero_grad()
    assert (next(model.parameters()) - next(mean_of_means.parameters())).abs().max() > 1e-4


def test_token_weighted_back_off(accelerator):
    global_batch = GlobalBatch(accelerator, GLOBAL_BATCH)
    model = global_batch.find_executable_batch_size(
        lambda device_batch: token_weighted(accelerator, global_batch, device_batch, fits=50))()
    assert global_batch.tried == [128, 64] and global_batch.steps == 4
    assert_same_weights(model, by_hand())


def test_out_of_memory_at_one_sample_is_named(accelerator):
    global_batch = GlobalBatch(accelerator, 4)

    def step(device_batch):
        raise RuntimeError(OOM.format(device_batch))

    with pytest.raises(TrainingFailed, match=r"even at 1 sample per process .*tried per-device batches \[4, 2, 1\]"
                                             r".*can't allocate memory.*gradient checkpointing"):
        global_batch.find_executable_batch_size(step)()


def test_bad_input_is_named(accelerator):
    with pytest.raises(InvalidType, match=r"needs the run's accelerate\.Accelerator, got int"):
        GlobalBatch(1, 128)
    with pytest.raises(InvalidValue, match="global_batch_size"):
        GlobalBatch(accelerator, 0)
    with pytest.raises(InvalidValue, match=r"device_batch 48 is no even plan's per-device batch of global batch "
                                           r"128 on 1 process\(es\): use one of \[128, 64, 32"):
        GlobalBatch(accelerator, 128).use(48)
    global_batch = GlobalBatch(accelerator, 128, 32)
    with pytest.raises(InvalidType, match=r"count\(batch\) must be an integer count of loss terms"):
        next(global_batch.updates([torch.ones(2)] * 4, count=lambda batch: batch.sum()))


def test_a_global_batch_that_splits_only_small_is_kept_and_warned_about(accelerator):
    with pytest.warns(SmallSplitWarning, match=r"global batch 127 splits evenly over 1 process\(es\) only as 127 GA "
                                               r"steps of 1 per device \(8 per device asked for\): kept, but slow; a "
                                               r"global batch of 112 or 128"):
        kept = GlobalBatch(accelerator, 127, max_device_batch=8)
    assert kept.device_batch == 1 and kept.steps == 127


@pytest.mark.slow
def test_two_processes_sum_the_counts_and_train_as_big_batches(torchrun, tmp_path):
    torchrun(WORKER, tmp_path, timeout=120)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    _, y = data()
    whole = [int((y[i:i + 128] != -100).sum()) for i in range(0, 640, 128)] * EPOCHS
    for rank in ranks:
        assert rank["totals"] == whole  # both processes' counts, summed on every process
        assert rank["local"] != rank["totals"]  # what one process alone counts
        assert rank["tried"] == [64] and rank["steps"] == 2  # 128 on 2 processes: 64 each OOMs, 2 x 32
        for got, want in zip(rank["params"], by_hand().parameters(), strict=True):
            torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), want.detach(), rtol=1e-10, atol=1e-12)


# ---- issue 47: Python's MemoryError re-planned; counts, short loaders and functions named -------------

def test_python_s_memory_error_is_re_planned_as_init_auto_and_auto_batch_re_plan_it(accelerator):
    """Accelerate's matcher takes a RuntimeError with its phrases only, so a MemoryError ended the
    run under GlobalBatch while aikit's init(G, "auto") and AutoBatch re-planned it."""
    tried = []

    def step(device_batch):
        tried.append(device_batch)
        if device_batch > 40:
            raise MemoryError(f"cannot allocate {device_batch * 10**9} bytes")
        return device_batch

    global_batch = GlobalBatch(accelerator, GLOBAL_BATCH)
    assert global_batch.find_executable_batch_size(step)() == 32
    assert tried == [128, 64, 32] and global_batch.tried == [128, 64] and accelerator.gradient_accumulation_steps == 4
    with pytest.raises(ZeroDivisionError):  # any other error is the user's, raised as it is, at once
        GlobalBatch(accelerator, GLOBAL_BATCH).find_executable_batch_size(lambda device_batch: 1 / 0)()


@pytest.mark.parametrize(("count", "error", "message"), [
    (lambda batch: -3, InvalidValue, r"count\(batch\) must be an integer >= 0, got -3; the number of loss terms"),
    (lambda batch: torch.tensor(-3), InvalidValue, r"count\(batch\) must be an integer >= 0, got -3"),
    (lambda batch: "4", InvalidType, r"count\(batch\) must be an integer >= 0, got '4'"),
    (lambda batch: 2.5, InvalidType, r"count\(batch\) must be an integer >= 0, got 2\.5"),
    (lambda batch: batch.sum(), InvalidType, r"count\(batch\) must be an integer count of loss terms, got a "
                                             r"torch\.float32 tensor"),
])
def test_a_count_that_is_no_count_of_loss_terms_is_named(accelerator, count, error, message):
    """count=lambda b: -3 was accepted (the total clamped to 1: each loss 12 times too large), a
    str raised torch's "new(): invalid data type 'str'"."""
    global_batch = GlobalBatch(accelerator, 128, 32)
    with pytest.raises(error, match=message):
        next(global_batch.updates([torch.ones(2)] * 4, count=count))
    assert [int(u.total) for u in global_batch.updates([torch.ones(2)] * 4, count=lambda batch: 3)] == [12]


@pytest.mark.parametrize("micro_batches", [0, 3])
def test_a_loader_without_one_whole_update_is_refused(accelerator, micro_batches):
    """A loader of fewer micro-batches than one update (or none) gave 0 updates, and no word."""
    global_batch = GlobalBatch(accelerator, 128, 32)
    with pytest.raises(InvalidValue) as raised:
        list(global_batch.updates([torch.ones(2)] * micro_batches, count=lambda batch: 2))
    assert str(raised.value) == (
        f"the loader gave {micro_batches} micro-batch(es), fewer than one update's 4 (global batch 128 as 4 GA steps "
        "of 32 per device on 1 process(es)): nothing was trained; give each process at least one update's "
        "micro-batches (a data set of at least 128 samples, DataLoader(batch_size=global_batch.device_batch))")
    assert len(list(global_batch.updates([torch.ones(2)] * 7, count=lambda batch: 2))) == 1  # 3 left out, as before


def test_a_training_function_without_a_batch_parameter_is_named(accelerator):
    """Accelerate's own check said "Batch size was passed into `train` as the first argument" to a
    user who had passed none."""
    def train():
        return 0

    with pytest.raises(InvalidType, match=r"find_executable_batch_size's function is called as function\(device_batch, "
                                          r"\.\.\.\), the per-device batch first, but .*train\(\) cannot be called so "
                                          r"\(too many positional arguments\): def train\(device_batch\)"):
        GlobalBatch(accelerator, 128).find_executable_batch_size(train)
    assert GlobalBatch(accelerator, 128).find_executable_batch_size(lambda device_batch, extra: extra)(7) == 7
