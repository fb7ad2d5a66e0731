"""examples/gpt_stdlib.py: a small GPT on the standard library's sources trains with token-weighted
GA, and under torchrun on 2 processes with FSDP2 it trains the same model as one process."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).parents[2] / "examples"
EXAMPLE = EXAMPLES / "gpt_stdlib.py"
pytestmark = pytest.mark.slow


def run_in_process(monkeypatch, *args: str) -> float:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), *args])
    threads = torch.get_num_threads()
    try:
        return runpy.run_path(str(EXAMPLE))["main"]()
    finally:
        torch.set_num_threads(threads)


def losses(out: str) -> list[float]:
    """The training losses it printed, then the validation loss."""
    return [float(v) for v in re.findall(r"train loss ([\d.]+)", out)] + \
        [float(re.search(r"validation loss ([\d.]+)", out).group(1))]


def test_the_model_and_the_batching_import_from_the_examples_folder(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from gpt_stdlib import TinyGPT, token_loss, update_micro_batches, validation_loss, windows  # noqa: F401

    model = TinyGPT(context=16, width=8, layers=1, heads=2)
    inputs = torch.tensor([[1, 2, 3], [4, 5, 0]])
    labels = torch.tensor([[2, 3, 9], [5, -100, -100]])
    loss, tokens = token_loss(model, inputs, labels)
    assert tokens.item() == 4 and loss.dim() == 0


def test_quick_mode_trains_and_prints_tokens_per_second_and_validation_loss(monkeypatch, capsys):
    loss = run_in_process(monkeypatch, "--quick", "--threads", "1")
    out = capsys.readouterr().out
    assert "GA steps per update: 4" in out and "tokens/s" in out
    train = losses(out)[:-1]
    assert train[-1] < train[0] < 5.6  # from log(256) = 5.55 down
    assert loss == pytest.approx(losses(out)[-1], abs=1e-3)


def test_torchrun_with_fsdp2_trains_the_same_model_as_one_process(monkeypatch, capsys, torchrun):
    run_in_process(monkeypatch, "--quick", "--threads", "1")
    one = losses(capsys.readouterr().out)
    done = torchrun(EXAMPLE, "--quick")
    assert "engine: torch.distributed (2 process(es))" in done.stdout and "GA steps per update: 2" in done.stdout
    assert losses(done.stdout) == pytest.approx(one, abs=2e-3)  # float32 sums in another order
