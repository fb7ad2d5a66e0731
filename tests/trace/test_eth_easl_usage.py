"""eth-easl's documented usage, run with only its import changed: its README's steps and its
MNIST example's training loop (variable_train_mnist.py, without torch_xla), digits standing in
for MNIST and the head of its own test/test_trace.csv as the trace."""

from __future__ import annotations

import pandas as pd
import pytest
from test_eth_easl import SEED_TRACE

from aikit.core.trace import TraceStepWarning

# The README's code blocks and the example's loop, verbatim but for the marked lines.
USAGE = '''
import torch
import torch.nn as nn
import torch.optim as optim
import aikit.elastic.Torch as vbs  # was: import variable_batch_size as vbs

train_sampler = vbs.CustomSampler(
  dataset_size=len(train_dataset),
  trace='trace.csv',
  num_replicas=WORLD_SIZE,
  rank=ORDINAL,
  minibatch_size=flags.batch_size)
train_loader = torch.utils.data.DataLoader(
  train_dataset,
  batch_sampler=train_sampler)

internal_optimizer = optim.SGD(model.parameters(), lr=lr, momentum=flags.momentum)
optimizer = vbs.LinearRuleOptimizer(
  internal_optimizer,
  train_sampler,
  ref_batchsize = 128,
  log_steps=flags.log_steps)
loss_fn = nn.NLLLoss()

def train_loop_fn(loader, epoch):
    model.train()
    for step, (data, target) in enumerate(loader):
      output = model(data)
      loss = loss_fn(output, target)
      loss.backward()
      optimizer.step()

for epoch in range(1, flags.num_epochs + 1):
    train_sampler.set_epoch(epoch-1)
    optimizer.set_epoch(epoch-1)
    train_loop_fn(train_loader, epoch)
'''


def test_the_readme_and_example_run_unchanged_on_digits(tmp_path, monkeypatch, capsys):
    import types

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from aikit.datasets import digits

    monkeypatch.chdir(tmp_path)
    pd.read_csv(SEED_TRACE).head(30).to_csv("trace.csv", index=False)  # eth-easl's own trace, step restart and all
    x, y, x_test, y_test = digits()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10), nn.LogSoftmax(dim=1))
    flags = types.SimpleNamespace(batch_size=32, momentum=0.5, log_steps=5, num_epochs=5)
    scope = {"train_dataset": TensorDataset(torch.as_tensor(x), torch.as_tensor(y, dtype=torch.long)),
             "WORLD_SIZE": 1, "ORDINAL": 0, "flags": flags, "model": model, "lr": 0.2}
    with pytest.warns(TraceStepWarning, match=r"row 10, line 12: step 0"):  # read anyway, as eth-easl reads it
        exec(compile(USAGE, "eth_easl_usage", "exec"), scope)
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["    MySampler (rank 0): Loaded trace starting with 128, 128,...",
                       "    MySampler (rank 0): trace_samples=9152, minibatches_per_epoch=44 => max_epoch=~6"]
    assert sum(line.startswith("    CustomOptimizer: Step=0, bs=") for line in out) == 5  # once per epoch
    assert "    CustomOptimizer: Step=0, bs=128, lr=(0.2,)" in out
    with torch.no_grad():
        accuracy = (model(torch.as_tensor(x_test)).argmax(1) == torch.as_tensor(y_test)).float().mean().item()
    assert accuracy >= 0.8, accuracy
