"""Two processes (torchrun --nproc-per-node 2): at each place where aikit waits for its peers,
rank 1 does its part up to the collective and then stops answering (it sleeps), as a peer on a
host that froze or lost its link does. Rank 0 must get a :class:`CollectiveError` after about
the configured timeout, never hang.

    stuck_peer_worker.py OUT_JSON TIMEOUT_S STORE_PORT HOSTS_PORT

Every place gets a fresh gloo process group (over a TCPStore of the worker's own on
STORE_PORT) with a TIMEOUT_S timeout; the XLA hosts' gloo group (aikit's own, for eth-easl's
multi-host scheme) waits AIKIT_HOST_TIMEOUT=TIMEOUT_S and meets at HOSTS_PORT. Rank 0 writes,
per place, the error's type, its message and the seconds it waited to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from aikit.elastic.Torch import CustomSampler, ElasticState, LinearRuleOptimizer
from aikit.ga.Torch.optim import Optimizer as GAOptimizer
from aikit.runtime.Torch.engines.xla import XLA

HOSTS_PORT = 0  # set by main()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def trace_optimizer(net: torch.nn.Module, broadcast: bool) -> LinearRuleOptimizer:
    sampler = CustomSampler(64, [16, 16, 16, 16], micro_batch=8, seed=1)
    return LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, ref_batch_size=16,
                               broadcast=broadcast)


def trace_step(rank: int, run_dir: Path):
    """LinearRuleOptimizer.step(): the update's all-reduce of the gradients."""
    net = model()
    opt = trace_optimizer(net, broadcast=False)
    opt.sampler.set_epoch(0)
    opt.set_epoch(0)
    batches = iter(opt.sampler)

    def block() -> None:
        for _ in range(2):  # a step of 16 = 2 micro-batches of 8 over 2 workers: one each
            batch = next(batches)
            net(torch.randn(len(batch), 4)).sum().backward()
            if opt.step():
                return

    return block


def trace_join(rank: int, run_dir: Path):
    """The trace optimizer's first set_epoch(): rank 0's parameters broadcast to every worker."""
    opt = trace_optimizer(model(), broadcast=True)
    return lambda: opt.set_epoch(0)


def ga_reduce(rank: int, run_dir: Path):
    """The GA wrapper with reduce=True: the all-reduce started in buckets during the last
    backward, waited for in step()."""
    net = model()
    opt = GAOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), 1, reduce=True)

    def block() -> None:
        net(torch.randn(8, 4)).sum().backward()
        opt.step()

    return block


def elastic_restore(rank: int, run_dir: Path):
    """ElasticState.restore(): rank 0 reads the last commit and broadcasts it."""
    net = model()
    opt = trace_optimizer(net, broadcast=True)
    state = ElasticState(run_dir / "ckpt", model=net, optimizer=opt, verbose=False)
    return state.restore


def xla_hosts_join(rank: int, run_dir: Path):
    """Joining aikit's gloo group of XLA hosts, the other host never arriving."""
    os.environ.update(MY_HOST_WORLD_SIZE="2", MY_HOST_ORDINAL=str(rank), MY_DIST_ROOT=f"127.0.0.1:{HOSTS_PORT}")
    return XLA._hosts_group


def xla_hosts_all_reduce(rank: int, run_dir: Path):
    """A sum across the XLA hosts over aikit's gloo group (what an XLA replica's all-reduce
    does on each host's ordinal 0), the other host joined but stuck."""
    xla_hosts_join(rank, run_dir)
    os.environ["MY_DIST_ROOT"] = f"127.0.0.1:{HOSTS_PORT + 1}"
    XLA._hosts_group()  # both hosts join
    tensor = torch.ones(3)
    return lambda: XLA._across_hosts([tensor], lambda group, flat: group.allreduce(flat), "an all-reduce")


PLACES = {"trace_step": trace_step, "trace_join": trace_join, "ga_reduce": ga_reduce,
          "elastic_restore": elastic_restore, "xla_hosts_join": xla_hosts_join,
          "xla_hosts_all_reduce": xla_hosts_all_reduce}


def main() -> None:
    global HOSTS_PORT
    out, timeout, store_port, HOSTS_PORT = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ["AIKIT_HOST_TIMEOUT"] = str(timeout)
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", store_port, world, rank == 0, timeout=timedelta(seconds=60))
    results = {}
    for name, place in PLACES.items():
        dist.init_process_group("gloo", store=dist.PrefixStore(name, store), rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        XLA._host_group = None
        never_arrives = name == "xla_hosts_join" and rank == 1  # this host never joins
        block = None if never_arrives else place(rank, out.parent)
        store.add(f"{name}/ready", 1)
        while store.add(f"{name}/ready", 0) < world:  # both at the collective (gloo's own wait would time out)
            time.sleep(0.01)
        if rank == 0:
            started = time.monotonic()
            try:
                block()
                results[name] = {"error": None}
            except Exception as error:  # what the user sees, whatever it is
                results[name] = {"error": type(error).__name__, "message": str(error)}
            results[name]["waited"] = time.monotonic() - started
        else:
            time.sleep(timeout + 1.0)  # stuck: no answer within the timeout
        store.add(f"{name}/done", 1)
        while store.add(f"{name}/done", 0) < world:
            time.sleep(0.01)
        dist.destroy_process_group()
    if rank == 0:
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
