"""aikit.core.critical_batch: the probe's estimate where the answer is known, its sample
accounting and rollback, the policy's growth, LR and state, and every refusal named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aikit.core.critical_batch import CriticalBatchProbe, ProbePolicy
from aikit.core.errors import InvalidState, InvalidType, InvalidValue, ProbeUnresolved


class Progress:
    """A run whose held-out loss falls, per sample, by McCandlish et al.'s efficiency
    ``1 / (1 + batch / critical)`` at the right LR (the sqrt rule's), by half that at the linear
    rule's: the critical batch of a probe is known in closed form. Each held-out sample's loss is
    the run's loss plus its own fixed offset (``spread``), so the paired error is zero."""

    def __init__(self, critical: float, held_out: int = 64, spread: float = 0.1, noise: float = 0.0) -> None:
        self.critical, self.dataset_size, self.loss, self.trained = critical, 10_000, 2.0, []
        self.offsets = np.random.default_rng(0).normal(0, spread, held_out)
        self.noise = np.random.default_rng(1).normal(0, noise, held_out) if noise else np.zeros(held_out)
        self.snapshots, self.scale, self.branches = 0, 1.0, []  # scale: the run's LR over 32's (the lr_scale)

    def snapshot(self):
        self.snapshots += 1
        return (self.loss, list(self.trained))

    def restore(self, snapshot) -> None:
        self.loss, self.trained = snapshot[0], list(snapshot[1])

    def train(self, indices, batch, lr_factor) -> None:
        k = batch / 32
        right = math.isclose(lr_factor * self.scale, math.sqrt(k))
        self.loss -= len(indices) * 1e-4 / (1 + batch / self.critical) * (1.0 if right else 0.5)
        self.trained.append((len(indices), batch, lr_factor))
        self.branches.append((batch, lr_factor * self.scale))  # every branch's batch and LR, not rolled back

    def evaluate(self):
        noise = self.noise * len(self.trained)  # a branch-dependent error where noise is given
        return self.loss + self.offsets + noise


def probe(**options) -> CriticalBatchProbe:
    ticks = iter(range(1000))
    return CriticalBatchProbe(1024, clock=lambda: float(next(ticks)), **options)


@pytest.mark.parametrize("epsilon, expected", [(0.05, 1), (0.2, 2), (0.3, 4), (0.5, 8)])
def test_the_estimate_where_the_answer_is_known(epsilon, expected):
    # efficiency of k*32 over 32's with critical 256: 1.125 / (1 + k / 8): k=2 0.90, 4 0.75, 8 0.5625
    run = Progress(critical=256)
    result = probe(epsilon=epsilon, rules=("sqrt", "linear")).run(run, 32, max_batch=1024, dataset_size=10_000)
    assert result.factor == expected and result.critical_batch == 32 * expected
    assert result.rule == (None if expected == 1 else "sqrt")  # the linear rule's LR does half as well here
    assert result.efficiency(2, "sqrt") == pytest.approx(0.9)


def test_samples_and_time_counted_and_every_branch_rolled_back():
    run = Progress(critical=256)
    before = run.snapshot()
    result = probe(epsilon=0.3, rules=("sqrt", "linear")).run(run, 32, max_batch=1024, dataset_size=10_000)
    # the base branch, then k = 2, 4 (recovered) and 8 (failed with both rules): 7 windows
    assert [(n, b) for n, b, _ in run.trained] == [] and run.loss == before[0]
    assert result.samples == 7 * 1024 and result.window == 1024
    assert result.seconds > 0
    assert set(result.losses) == {(k, r) for k in (2, 4, 8) for r in ("sqrt", "linear")}


def test_larger_factors_are_not_tried_once_one_fails():
    run = Progress(critical=64)  # k=2: 1.5 / 2 = 0.75 < 0.8
    result = probe(epsilon=0.2).run(run, 32, max_batch=1024, dataset_size=10_000)
    assert result.factor == 1 and set(result.losses) == {(2, "sqrt")} and result.samples == 2 * 1024


def test_factors_stop_at_the_bounds_the_world_splits():
    p = probe()
    assert p.factors(32, max_batch=1024, runs=lambda b: True) == [2, 4, 8]
    assert p.factors(32, max_batch=100, runs=lambda b: True) == [2]
    assert p.factors(32, max_batch=1024, runs=lambda b: b % 3 == 0 or b < 100) == [2]


def test_bad_input_is_refused_by_name():
    run = Progress(critical=256)
    with pytest.raises(InvalidValue, match="longer than what is left of the run"):
        probe().run(run, 32, max_batch=1024, dataset_size=10_000, samples_left=1000)
    with pytest.raises(InvalidValue, match="cannot try k=3 at batch 32: 96 does not split over the world"):
        probe().run(run, 32, max_batch=1024, dataset_size=10_000, runs=lambda b: b % 64 == 0 or b == 32,
                    factors=[2, 3])
    with pytest.raises(InvalidValue, match="no batch above 512 to probe"):
        probe().run(run, 512, max_batch=1000, dataset_size=10_000)
    with pytest.raises(InvalidValue, match="LR rules must be some of"):
        CriticalBatchProbe(1024, rules=("cubic",))
    with pytest.raises(InvalidValue, match="epsilon"):
        CriticalBatchProbe(1024, epsilon=1.5)
    assert run.snapshots == 0  # refused before any branch


def test_a_held_out_set_too_small_to_tell_epsilon_apart():
    run = Progress(critical=256, held_out=3, noise=0.05)
    with pytest.raises(ProbeUnresolved, match=r"held-out set of 3 samples cannot tell epsilon=0\.2") as raised:
        probe().run(run, 32, max_batch=1024, dataset_size=10_000)
    assert raised.value.samples == 1024 and run.loss == 2.0  # the base branch was spent, and rolled back
    # the same noise over many held-out samples tells it apart
    assert probe().run(Progress(critical=256, held_out=4096, noise=0.05), 32, max_batch=1024,
                       dataset_size=10_000).factor == 2


def test_a_run_that_cannot_be_snapshot():
    run = Progress(critical=256)
    run.snapshot = lambda: None
    with pytest.raises(InvalidState, match="cannot be snapshot"):
        probe().run(run, 32, max_batch=1024, dataset_size=10_000)
    assert run.trained == []


def test_the_policy_grows_by_the_probes_factor_with_its_rule_and_probes_less_once_it_settles():
    run = Progress(critical=256)
    policy = ProbePolicy(probe(epsilon=0.3, rules=("sqrt", "linear")), first=2000, budget=10**6)
    assert not policy.due(1999, 32, 1024) and policy.due(2000, 32, 1024)
    assert policy.act(run, 32, 2000, max_batch=1024) == 128
    assert policy.lr_scale == pytest.approx(2.0) and policy.rules == ("sqrt",) and policy.next_at == 4000
    assert policy.act(run, 128, 4000, max_batch=1024) == 256  # 256 against 128: 1.5 / 2 = 0.75 >= 0.7
    assert policy.lr_scale == pytest.approx(2 * math.sqrt(2)) and policy.rows[-1]["critical_batch"] == 256
    assert [row["batch"] for row in policy.rows] == [32, 128]
    assert policy.probe_samples == sum(row["probe_samples"] for row in policy.rows) > 0
    settled = ProbePolicy(probe(epsilon=0.05), first=2000)
    assert settled.act(run, 32, 2000, max_batch=1024) is None and settled.next_at == 8000  # spacing²


def test_the_policy_state_round_trips_and_a_bad_one_changes_nothing():
    run = Progress(critical=256)
    policy = ProbePolicy(probe(epsilon=0.3, rules=("sqrt", "linear")), first=2000)
    policy.act(run, 32, 2000, max_batch=1024)
    fresh = ProbePolicy(probe(epsilon=0.3, rules=("sqrt", "linear")), first=2000)
    fresh.load_state_dict(policy.state_dict())
    assert fresh.state_dict() == policy.state_dict()
    with pytest.raises(InvalidValue, match="not a ProbePolicy state"):
        fresh.load_state_dict({"next_at": 1})
    with pytest.raises(InvalidValue, match="lr_scale"):
        fresh.load_state_dict({**policy.state_dict(), "lr_scale": -1})
    assert fresh.state_dict() == policy.state_dict()


def test_with_shrink_a_later_probe_moves_back_down_by_the_factor_at_the_inverse_lr():
    run = Progress(critical=256)
    policy = ProbePolicy(probe(epsilon=0.3), first=2000, shrink=True)
    assert policy.act(run, 32, 2000, max_batch=128) == 128  # x4 at sqrt's LR: 2x
    run.scale = policy.lr_scale
    assert policy.down_factor(128) == 4 and policy.due(4000, 128, max_batch=128)  # at max_batch: still due
    run.critical, run.branches = 128, []  # now 64 recovers against 32 (0.83) and 128 does not (0.625)
    assert policy.act(run, 128, 4000, max_batch=128) == 64
    assert policy.lr_scale == pytest.approx(math.sqrt(2)) and policy.rows[-1]["batch"] == 128
    assert policy.rows[-1]["critical_batch"] == 64 and policy.next_at == 8000
    # the base branch trained 32 at 32's LR (the run's over sqrt 4), the branches 64 and 128 at theirs
    assert [b for b, _ in run.branches] == [32, 64, 128]
    assert [lr for _, lr in run.branches] == pytest.approx([1, math.sqrt(2), 2])
    run.scale = policy.lr_scale
    assert policy.down_factor(64) == 2  # within the batch the run started at
    run.critical = 10**6
    assert policy.act(run, 64, 8000, max_batch=128) == 128 and policy.lr_scale == pytest.approx(2.0)
    # at max_batch, where the batches below do not split over the world, nothing is probed
    stuck = ProbePolicy(probe(epsilon=0.3), first=2000, shrink=True)
    assert stuck.act(Progress(critical=256), 32, 2000, max_batch=128) == 128 and stuck.due(4000, 128, 128)
    assert stuck.act(run, 128, 4000, max_batch=128, runs=lambda b: b != 64) is None
    assert stuck.next_at == 16000 and len(stuck.rows) == 1
    # without shrink the same grown run only looks up, and at max_batch is not due
    grows = ProbePolicy(probe(epsilon=0.3), first=2000)
    assert grows.act(Progress(critical=256), 32, 2000, max_batch=128) == 128
    assert grows.down_factor(128) == 1 and not grows.due(4000, 128, max_batch=128)


def test_a_shrink_round_trips_through_the_state():
    run = Progress(critical=256)
    policy = ProbePolicy(probe(epsilon=0.3), first=2000, shrink=True)
    policy.act(run, 32, 2000, max_batch=1024)
    run.scale, run.critical = policy.lr_scale, 128
    policy.act(run, 128, 4000, max_batch=1024)
    fresh = ProbePolicy(probe(epsilon=0.3), first=2000, shrink=True)
    fresh.load_state_dict(policy.state_dict())
    assert fresh.state_dict() == policy.state_dict() and fresh.down_factor(64) == policy.down_factor(64) == 2


def test_first_as_a_fraction_of_the_budget():
    assert ProbePolicy(probe(), first=0.25, budget=10_000).next_at == 2500
    with pytest.raises(InvalidValue, match="fraction of the run's samples, but no budget"):
        ProbePolicy(probe(), first=0.25)
    with pytest.raises(InvalidType, match="first"):
        ProbePolicy(probe(), first=1.5, budget=10_000)


# ---- issue 47's bad inputs: a probe given a mean, a controller given no branches ----------------------

@pytest.mark.parametrize("z", [2.0, 0.0])
def test_held_out_losses_given_as_one_mean_are_refused_whatever_z(z):
    """A losses() that returned the mean was told "held-out set of 1 samples" (256 were given),
    and with z=0 it passed, deciding on one number with no standard error."""
    run = Progress(critical=256)
    run.evaluate = lambda: np.float64((run.loss + run.offsets).mean())
    with pytest.raises(InvalidValue) as raised:
        probe(z=z).run(run, 32, max_batch=1024, dataset_size=10_000)
    assert str(raised.value).startswith("the probe's held-out losses must be one per held-out sample (their "
                                        "spread gives the standard error), got one number (2.007): return the "
                                        "unreduced losses")
    assert run.loss == 2.0 and run.trained == []  # refused before any branch trained


def test_a_controller_attached_to_what_is_no_training_is_refused_at_once():
    """controller.attach("branches") was accepted, and failed only when the first probe ran."""
    from aikit.core.critical_batch import ProbeController

    controller = ProbeController(ProbePolicy(probe(), first=1024), 64, ref_batch_size=32, max_batch=1024)
    with pytest.raises(InvalidType, match=r"controller\.attach\(\) takes the training a probe branches from "
                                          r"\(snapshot, restore, train, evaluate and dataset_size.*got str "
                                          r"'branches': PyTorch: "
                                          r"aikit\.elastic\.Torch\.TorchBranches"):
        controller.attach("branches")
    assert controller.branches is None
    controller.attach(Progress(critical=256))
    assert controller.branches is not None
