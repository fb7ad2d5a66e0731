"""A batch ramp written in samples (nanochat's stages, Seesaw) resumed from an ElasticState
commit taken in the middle of a stage: the run continues with the stage's batch and LR and ends
at the uninterrupted run's weights, to the bit (one process, float64)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from resize_common import SEED, N, digits_subset, loss_of, make_model, make_sgd
from torch.utils.data import DataLoader, TensorDataset

from aikit.core.ramp import seesaw_schedule, staged_schedule
from aikit.core.scaling import cosine_decay
from aikit.core.trace import TraceExhaustedError, schedule_trace
from aikit.elastic.Torch import CustomSampler, ElasticState, RootRuleOptimizer, SeesawOptimizer

MICRO, BUDGET = 8, 3 * N  # three epochs' worth of samples


def nanochat():
    """A quarter of batch 64 over the first 10 % of the budget, half over the next 30 %, then 64,
    each stage at the square root of its batch times the LR tuned at 64 (nanochat's rule)."""
    schedule = staged_schedule(64, BUDGET, [("1/4", "10%"), ("1/2", "30%")])
    return schedule, lambda opt, sampler: RootRuleOptimizer(opt, sampler, ref_batchsize=64)


def seesaw():
    """Seesaw over a cosine: from 16, doubling where the cosine halves, up to 64."""
    decay = cosine_decay(BUDGET)
    schedule = seesaw_schedule(16, decay, max_batch=64)
    return schedule, lambda opt, sampler: SeesawOptimizer(opt, sampler, ref_batchsize=16, lr_decay=decay)


def build(directory, make, restarted=False):
    schedule, wrap = make()
    model = make_model()
    if restarted:  # a new process: other weights, which only the restore can bring back
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    sampler = CustomSampler(N, schedule_trace(schedule, samples=BUDGET), minibatch_size=MICRO, seed=SEED,
                            when_exhausted="stop")
    opt = wrap(make_sgd(model), sampler)
    return model, opt, ElasticState(directory, model=model, optimizer=opt, verbose=False)


def epochs(sampler) -> int:
    """Epochs the budget's trace trains (its last one cut short where the trace ends)."""
    count = 0
    while True:
        try:
            sampler.schedule.epoch_bounds(count)
        except TraceExhaustedError:
            return count
        count += 1


def train(x, y, model, opt, state, stop_after_micro=None) -> list[int]:
    """Train the whole budget, committing after every update, or stop after that many
    micro-batches (a kill); the batch of every update trained."""
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_sampler=opt.sampler)
    micro, batches = 0, []
    for _ in state.epochs(epochs(opt.sampler)):
        for xb, yb in loader:
            batch = opt.get_bs()
            loss_of(model, xb, yb).backward()
            micro += 1
            if opt.step():
                batches.append(batch)
                state.commit()
            if micro == stop_after_micro:
                return batches
    return batches


@pytest.mark.parametrize("make", [nanochat, seesaw], ids=["nanochat-stages", "seesaw-cosine"])
def test_a_commit_inside_a_stage_resumes_to_the_same_bits(tmp_path, make):
    x, y = digits_subset()
    uninterrupted = build(tmp_path / "whole", make)
    all_batches = train(x, y, *uninterrupted)
    schedule = make()[0]
    before = np.concatenate(([0], np.cumsum(all_batches)))
    second = int(np.searchsorted(before, schedule.thresholds[1]))  # the first update of the second stage
    third = int(np.searchsorted(before, schedule.thresholds[2]))
    assert third - second >= 4, "the second stage must span several updates"
    stop = second + (third - second) // 2  # inside the second stage ...
    micro = sum(b // MICRO for b in all_batches[:stop]) + 1  # ... and one micro-batch into its next step
    killed = train(x, y, *build(tmp_path / "split", make), stop_after_micro=micro)
    assert killed == all_batches[:stop]
    model, opt, state = build(tmp_path / "split", make, restarted=True)
    assert state.restore() is True and opt.updates == stop  # the commit before the kill: mid-stage
    rest = train(x, y, model, opt, state)
    assert killed + rest == all_batches  # the same batch at every update, the stage's to its end
    whole = uninterrupted[0].state_dict()
    assert all(torch.equal(model.state_dict()[k], whole[k]) for k in whole)


WORKER = Path(__file__).with_name("ramp_world_worker.py")


def run_alone(*args) -> None:
    done = subprocess.run([sys.executable, str(WORKER), *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_balanced_ramp_resumes_on_a_world_that_fits_the_steps_still_to_train(torchrun, tmp_path):
    """Steps 0 and 1 (one micro-batch each) ran on one process; two replicas resume at step 2,
    whose batches all split in two (Megatron #3913's deferred check), and end at the weights of
    the run on one process."""
    run_alone("whole", tmp_path / "whole", "fits")
    run_alone("first", tmp_path / "split", "fits")
    done = torchrun(WORKER, "resume", tmp_path / "split", "fits")
    assert "rank 0 trained 6 updates" in done.stdout and "rank 1 trained 6 updates" in done.stdout
    whole, split = np.load(tmp_path / "whole" / "final.npz"), np.load(tmp_path / "split" / "final.npz")
    assert max(float(np.abs(whole[k] - split[k]).max()) for k in whole.files) < 1e-12


def test_a_world_that_does_not_fit_the_steps_still_to_train_is_refused_with_the_sizes_that_do(torchrun, tmp_path):
    run_alone("first", tmp_path, "misfits")
    done = torchrun(WORKER, "resume", tmp_path, "misfits")
    for rank in (0, 1):
        assert (f"rank {rank} refused: the checkpoint {tmp_path}/aikit_state.000000002.safetensors cannot resume on 2 "
                "replica(s): 2 replicas cannot each take whole micro-batches of 4 of the trace from step 2 on: batch "
                "12 is 3 micro-batches; world sizes that fit: 1, 3; resume on one of those, or with another trace"
                ) in done.stdout, done.stdout
