"""aikit's GA against Run:AI's AIkit itself (PyPI ``runai==0.4.1``), side by side on the same model
and data: with ``reduction="sum"`` every prebuilt optimizer and the wrapper train to the same
bits as the original; aikit's default (the mean) differs by exactly the original's factor."""

from __future__ import annotations

import copy

import pytest
import torch

import aikit.ga.Torch

runai = pytest.importorskip("runai.ga.torch", reason="runai==0.4.1 is a test dependency")

# the optimizers Run:AI's AIkit prebuilt (its own list), with settings that exercise their state
ORIGINAL = {
    "Adadelta": {}, "Adagrad": {}, "Adam": {"weight_decay": 0.01}, "AdamW": {}, "Adamax": {}, "ASGD": {},
    "SGD": {"lr": 0.05, "momentum": 0.9}, "Rprop": {}, "RMSprop": {"momentum": 0.5},
}


def train(make, reduction: str = "mean", steps: int = 3, updates: int = 3) -> list[torch.Tensor]:
    """A small float64 MLP trained on ``updates`` windows of ``steps`` micro-batches of 4, the
    loop of Run:AI's examples (zero_grad, backward, step), with a loss of ``reduction``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).double()
    optimizer = make(model.parameters())
    gen = torch.Generator().manual_seed(1)
    for _ in range(updates * steps):
        x = torch.randn(4, 5, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 3, (4,), generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y, reduction=reduction).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ORIGINAL)
@pytest.mark.parametrize("loss", ["mean", "sum"])
def test_the_sum_switch_trains_to_the_originals_bits(name, loss):
    """Whatever the loss, Run:AI's AIkit summed the micro-batch gradients: so does reduction='sum'."""
    kwargs = ORIGINAL[name]
    original = train(lambda p: getattr(runai.optim, name)(3, p, **kwargs), loss)
    prebuilt = train(lambda p: getattr(aikit.ga.Torch.optim, name)(3, p, reduction="sum", **kwargs), loss)
    wrapped = train(lambda p: aikit.ga.Torch.optim.Optimizer(getattr(torch.optim, name)(p, **kwargs), 3,
                                                              reduction="sum"), loss)
    for mine, other, theirs in zip(prebuilt, wrapped, original, strict=True):
        assert torch.equal(mine, theirs) and torch.equal(other, theirs)


def test_the_default_mean_is_the_original_at_an_lr_divided_by_the_steps():
    """With SGD (no momentum) the original's sum is the mean's update at ``steps`` times its LR."""
    original = train(lambda p: runai.optim.SGD(3, p, lr=0.01))
    mean = train(lambda p: aikit.ga.Torch.optim.SGD(3, p, lr=0.03))
    for mine, theirs in zip(mean, original, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-14)


def test_a_run_ai_state_dict_saved_between_updates_resumes_to_the_same_bits():
    """Run:AI's AIkit's GA state_dict (its counter in ``state['runai']``), as a user holds it after
    loading their checkpoint, continues in aikit with reduction='sum' exactly as in the original."""
    def model():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 2).double()

    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(3, 4, generator=gen, dtype=torch.float64),) for _ in range(12)]

    def micro_step(net, optimizer, x):
        optimizer.zero_grad()
        net(x).pow(2).sum().backward()
        optimizer.step()

    theirs = model()
    original = runai.optim.Adam(3, theirs.parameters(), lr=0.01)
    for (x,) in batches[:6]:
        micro_step(theirs, original, x)
    saved = copy.deepcopy(original.state_dict())  # as from a checkpoint file: torch shares the state's tensors
    mine = model()
    mine.load_state_dict(theirs.state_dict())
    resumed = aikit.ga.Torch.optim.Adam(3, mine.parameters(), lr=0.01, reduction="sum")
    resumed.load_state_dict(saved)
    assert (resumed.micro_steps, resumed.micro_step) == (6, 0)
    for (x,) in batches[6:]:
        micro_step(theirs, original, x)
        micro_step(mine, resumed, x)
    for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)

    mean = aikit.ga.Torch.optim.Adam(3, model().parameters(), lr=0.01)
    with pytest.raises(ValueError, match="saved by an optimizer with reduction='sum', this one has reduction='mean'"):
        mean.load_state_dict(saved)
    micro_step(theirs, original, batches[0][0])
    with pytest.raises(ValueError, match="Run:AI's AIkit's state_dict was saved 1 micro-steps into an update of "
                                         "steps=3, and Run:AI's AIkit does not save the gradients"):
        resumed.load_state_dict(original.state_dict())
