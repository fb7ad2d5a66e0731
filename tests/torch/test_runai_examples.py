"""Run:AI's AIkit's documented PyTorch usage, run with only the imports changed.

The scripts are Run:AI's own examples, verbatim (tests/runai_originals), migrated by
tests/runai_migration.py (``runai.ga.torch`` -> ``aikit.ga.Torch``, ``runai.elastic`` ->
``aikit.elastic``), with the embedded digits standing in for MNIST, for a few updates.
"""

from __future__ import annotations

import random
import re
import sys

import pytest
import runai_migration
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import aikit.elastic
import aikit.elastic.Torch
import aikit.ga.Torch

SMALL = ["--epochs", "1", "--samples", "64", "--test-samples", "50", "--log-interval", "1"]


def run_example(monkeypatch, capsys, name: str, args: list[str], prebuilt: bool) -> tuple[str, list[type]]:
    """Run the migrated script; returns what it printed and the class of every optimizer whose
    step() ran (torch's global step hook sees the GA wrapper's calls and the real updates)."""
    runai_migration.install_stand_ins(monkeypatch)
    # the examples pick the wrapper or the prebuilt optimizer at random (random.choice([True, False]))
    monkeypatch.setattr(random, "choice", lambda options: options[1] if prebuilt else options[0])
    monkeypatch.setattr(sys, "argv", [name, *args])
    for variable in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    stepped: list[type] = []
    handle = register_optimizer_step_post_hook(lambda opt, *_: stepped.append(type(opt)))
    threads = torch.get_num_threads()
    try:
        runai_migration.run(name)
    finally:
        handle.remove()
        torch.set_num_threads(threads)
    return capsys.readouterr().out, stepped


def losses(out: str) -> list[float]:
    return [float(v) for v in re.findall(r"Loss: ([\d.]+)", out)]


@pytest.mark.slow  # trains the original's CNN (a few seconds of CPU)
def test_ga_example_makes_one_adadelta_update_per_ga_steps_with_either_form(monkeypatch, capsys):
    """examples/ga/torch/mnist.py: ``Optimizer(Adadelta(...), steps)`` and the prebuilt
    ``Adadelta(steps, params, lr=...)`` train identically, one real update per 2 micro-batches."""
    args = [*SMALL, "--ga-steps", "2", "--batch-size", "16"]
    wrapped, wrapped_steps = run_example(monkeypatch, capsys, "ga_torch_mnist.py", args, prebuilt=False)
    prebuilt, prebuilt_steps = run_example(monkeypatch, capsys, "ga_torch_mnist.py", args, prebuilt=True)
    assert wrapped == prebuilt  # same seed, same arithmetic: the same printed losses and test result
    assert wrapped_steps.count(torch.optim.Adadelta) == 64 // (16 * 2)
    assert prebuilt_steps.count(aikit.ga.Torch.optim.Adadelta) == 64 // 16  # every micro-batch's step() call
    assert "Test set: Average loss:" in wrapped and len(losses(wrapped)) == 4


@pytest.mark.slow
def test_elastic_example_takes_its_plan_from_aikit_elastic(monkeypatch, capsys):
    """examples/elastic/torch/mnist.py: ``runai.elastic.torch.init(G, M)`` then ``runai.elastic.steps``
    and ``runai.elastic.batch_size``, with the model in ``nn.DataParallel``."""
    args = [*SMALL, "--global-batch-size", "32", "--gpu-batch-size", "16"]
    out, stepped = run_example(monkeypatch, capsys, "elastic_torch_mnist.py", args, prebuilt=True)
    assert (aikit.elastic.steps, aikit.elastic.batch_size, aikit.elastic.global_batch_size) == (2, 16, 32)
    assert (aikit.elastic.gpus, aikit.elastic.master) == (1, True)
    assert stepped.count(torch.optim.Adadelta) == 64 // 32
    assert "Test set: Average loss:" in out and "Train Epoch: 1 [48/64" in out


def test_original_elastic_statics():
    """run-ai/runai tests/test_elastic.py, through aikit.elastic.Torch.init (its ``_init`` was private)."""
    rng = random.Random(0)
    for _ in range(20):
        global_batch_size = rng.randint(10, 100)
        max_gpu_batch_size = rng.randint(1, global_batch_size)
        gpus = 1

        aikit.elastic.Torch.init(global_batch_size=global_batch_size, max_gpu_batch_size=max_gpu_batch_size,
                                 gpus=gpus)

        assert aikit.elastic.global_batch_size == global_batch_size
        assert aikit.elastic.gpus == gpus
        assert aikit.elastic.master is True
        assert not hasattr(aikit.elastic, "hvd")
        # aikit's plan never exceeds max_gpu_batch_size and always makes exactly the global batch
        assert aikit.elastic.batch_size <= max_gpu_batch_size
        assert sum(map(sum, aikit.elastic.Torch.plan.micro_batch_sizes)) == global_batch_size


def test_the_migration_changes_only_imports():
    source = runai_migration.migrated("ga_torch_mnist.py")
    original = (runai_migration.ORIGINALS / "ga_torch_mnist.py").read_text()
    changed = [(a, b) for a, b in zip(original.splitlines(), source.splitlines(), strict=True) if a != b]
    assert changed == [
        ("import runai.ga.torch", "import aikit.ga.Torch"),
        ("            optimizer = runai.ga.torch.optim.Optimizer(optimizer, args.ga_steps)",
         "            optimizer = aikit.ga.Torch.optim.Optimizer(optimizer, args.ga_steps)"),
        ("            optimizer = runai.ga.torch.optim.Adadelta(args.ga_steps, model.parameters(), lr=args.lr)",
         "            optimizer = aikit.ga.Torch.optim.Adadelta(args.ga_steps, model.parameters(), lr=args.lr)"),
    ]


@pytest.fixture(autouse=True)
def _quiet_dropout_warning():
    """The original model applies Dropout2d to a 2-D tensor, which torch 2.13 warns about."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dropout2d: Received a 2-D input")
        yield
