"""One replica of a real 2-process probed adaptive run (torchrun, gloo, float64).

The run of ``test_probe_torch.probed`` (SGD, probes from 64 samples, sqrt and linear rules), its
model started differently on each rank (the optimizer broadcasts rank 0's). Saves, per rank: the
parameters after every update, the samples each micro-batch trained, the batches, every update's
LR and the probe policy's rows.
Usage: torchrun --standalone --nproc-per-node 2 probe_worker.py OUT_DIR [whole|shard]
"""

import sys
from pathlib import Path

import torch
from adaptive_common import dataset
from test_probe_torch import make_model, probed, train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from replica_worker import start

EPOCHS = 3


def main(out: Path, held_out: str) -> None:
    rank = start("torch.distributed")
    data, model = dataset(noise=0.1), make_model(seed=rank)
    if held_out == "whole":
        sampler, optimizer = probed(data, model)
    else:  # each replica compares on its own half of the held-out set: the third probe decides 64 on one, 32 on
        # the other (a margin epsilon=0.5 and the linear rule leave wide enough for every shard to agree)
        sampler, optimizer = probed(data, model, epsilon=0.2, rules=("sqrt",))
        sampler.controller.branches.held_out = tuple(t[rank::2] for t in data.tensors)
    samples = []
    history = train(model, data, EPOCHS, sampler, optimizer,
                    on_batch=lambda y: samples.append((optimizer.updates, y[:, 1].long().tolist())))
    torch.save({"history": history, "samples": samples, "batches": sampler.controller.batches,
                "lrs": [row["lr"] for row in optimizer.history],
                "rows": [{**row, "probe_seconds": 0} for row in sampler.controller.batch_policy.rows]},
               out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "whole")
