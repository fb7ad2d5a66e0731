"""One of two torchrun processes (gloo, CPU): Accelerate's MULTI_CPU run of the token-weighted
digits through GlobalBatch, 64 per process out of memory, so 2 GA steps of 32; writes its
counts and final weights to OUT/rank<R>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate_case import GLOBAL_BATCH, IGNORE, token_weighted

from aikit.integrations.accelerate import GlobalBatch


def main(out: Path) -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, accelerator.state
    global_batch = GlobalBatch(accelerator, GLOBAL_BATCH)
    totals, local = [], []
    counting = global_batch.updates

    def updates(batches, count):  # what this process alone counts, beside the totals
        for update in counting(batches, count):
            local.append(int(sum((y != IGNORE).sum() for _, y in update.micro_batches)))
            yield update

    global_batch.updates = updates
    def attempt(device_batch):
        totals.clear(), local.clear()  # a try that ran out of memory counted its first update
        return token_weighted(accelerator, global_batch, device_batch, fits=40, totals=totals)

    model = global_batch.find_executable_batch_size(attempt)()
    result = {"totals": [int(t) for t in totals], "local": local, "tried": global_batch.tried,
              "steps": global_batch.steps, "params": [p.detach().tolist() for p in model.parameters()]}
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.end_training()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
