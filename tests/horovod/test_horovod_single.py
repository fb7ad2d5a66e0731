"""aikit's Horovod glue in one process: its errors, and a world of one (hvd.init() without horovodrun)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from hvd_case import CASES, reference, train

pytestmark = pytest.mark.horovod


def test_without_horovod_the_import_error_says_how_to_install_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "aikit.elastic.Torch.horovod", raising=False)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(ImportError, match=r"build it with scripts/install_horovod.sh"):
        importlib.import_module("aikit.elastic.Torch.horovod")


def test_before_hvd_init_the_glue_says_to_initialise(monkeypatch, require_horovod):
    from aikit.elastic.Torch import horovod

    model = torch.nn.Linear(2, 1)
    with pytest.raises(RuntimeError, match=r"Horovod is not initialised: call horovod.torch.init\(\)"):
        horovod.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), 2)
    with pytest.raises(RuntimeError, match=r"Horovod is not initialised"):
        horovod.broadcast_state(model)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_world_of_one_with_short_windows_equals_the_big_batch_steps(hvd, case):
    from aikit.elastic.Torch import distributed

    assert (distributed.engine(), distributed.world_size()) == ("horovod", 1)
    for got, want in zip(train(case)["params"], reference(case), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_the_ga_wrapper_refuses_horovods_distributed_optimizer(hvd):
    from aikit.ga.Torch.optim import Optimizer

    model = torch.nn.Linear(2, 1)
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2)
    with pytest.raises(TypeError, match=r"wrap the plain torch optimizer with aikit.elastic.Torch.horovod"):
        Optimizer(wrapped, 2)


def test_horovod_elastic_state_saves_restores_and_syncs_the_ga_optimizer_whole(hvd):
    """hvd.elastic.TorchState takes aikit's optimizer: a restore puts back the GA position and the
    pending gradients of the last commit (Horovod's own handler would fail on its state_dict)."""
    from aikit.elastic.Torch import horovod

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = horovod.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), 2)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()  # one micro-step of two
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)
    committed = [p.grad.clone() for p in model.parameters()]
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()  # the update: position 0, gradients cleared, momentum set
    assert optimizer.micro_step == 0 and optimizer.optimizer.state
    state.restore()
    assert optimizer.micro_step == 1 and not optimizer.optimizer.state
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), committed, strict=True))
    state.sync()  # a world of one: nothing to send, nothing changes
    assert optimizer.micro_step == 1
