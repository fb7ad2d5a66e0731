"""One TorchFT replica group (one process) of the tests' run: the trace path (CustomSampler +
LinearRuleOptimizer) or the GA path (the GA Optimizer fed by an UpdateSampler), through a
ReplicaGroup. It writes one JSON line per event to ``--log``: its start (pid), every update it took
part in (committed or not: its position, the quorum, the samples it trained, the parameters after
it), its heals, and its end. ``--pause-in P`` sleeps ``--pause-s`` inside its first micro-batch of
update P (the tests kill it there: mid-update); ``--pause-after P`` sleeps after committing update P
(between updates); either ends early once the ``--resume`` file exists. ``--slow-s`` sleeps in
every micro-batch from update ``--slow-from`` on (a slow group). With ``--go FILE`` it joins the
lighthouse, then waits for FILE before its first quorum, so that groups begin together."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ft_common as common

from aikit.elastic.Torch import CustomSampler, ElasticState, LinearRuleOptimizer
from aikit.elastic.Torch.fault_tolerance import ReplicaGroup
from aikit.elastic.Torch.update_sampler import UpdateSampler
from aikit.ga.Torch.optim import Optimizer


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, kind, default in (("lighthouse", str, None), ("id", str, None), ("log", str, None),
                                ("path", str, "trace"), ("epochs", int, 2), ("directory", str, None),
                                ("pause-in", int, -1), ("pause-after", int, -1), ("pause-s", float, 0.0),
                                ("slow-s", float, 0.0), ("timeout-s", float, 10.0), ("min-replicas", int, 1),
                                ("quorum-timeout-s", float, 60.0), ("restore", int, 0), ("commit-every", int, 0),
                                ("go", str, None), ("resume", str, None), ("slow-from", int, 0)):
        parser.add_argument(f"--{name}", type=kind, default=default)
    args = parser.parse_args()
    log = Path(args.log).open("a", buffering=1)  # noqa: SIM115 (open for the whole run, one line an event)

    def write(event: str, **fields) -> None:
        log.write(json.dumps({"event": event, "id": args.id, "pid": os.getpid(), "time": time.time(), **fields}) + "\n")

    write("start")
    x, y = common.data()
    net = common.model()
    sgd = torch.optim.SGD(net.parameters(), lr=common.LR, momentum=common.MOMENTUM)
    if args.path == "trace":
        sampler = CustomSampler(common.SAMPLES, common.TRACE, micro_batch=common.MICRO, seed=common.SEED,
                                when_exhausted="cycle")
        optimizer = LinearRuleOptimizer(sgd, sampler, ref_batch_size=common.REF_BATCH)
        kept = {"model": net, "optimizer": optimizer}
    else:
        optimizer = Optimizer(sgd, 1, reduce=True, global_batch_size=common.GLOBAL_BATCH)
        sampler = UpdateSampler(common.SAMPLES, common.GLOBAL_BATCH, common.MAX_DEVICE_BATCH, seed=common.SEED)
        kept = {"model": net, "optimizer": optimizer, "samples": sampler}
    state = ElasticState(args.directory or Path(args.log).parent / "commits", verbose=False, fsync=False, **kept)
    if args.restore:
        write("restored", found=state.restore())
    trained: list[int] = []
    paused = set()

    def pause(where: str, position: int) -> None:  # --pause-s seconds, or until the --resume file appears
        paused.add(where)
        write("paused", position=position, where=where)
        ends = time.monotonic() + args.pause_s
        while time.monotonic() < ends and not (args.resume and Path(args.resume).exists()):
            time.sleep(0.05)

    def on_update(group: ReplicaGroup, committed: bool) -> None:
        position = group.updates - committed
        write("update", position=position, committed=committed, replicas=group.replicas, rank=group.rank,
              indices=list(trained), params=common.flat(net) if committed else None)
        trained.clear()
        if committed and position == args.pause_after and "after" not in paused:
            pause("after", position)

    group = ReplicaGroup(state, args.lighthouse, replica_id=args.id, min_replicas=args.min_replicas,
                         timeout_s=args.timeout_s, quorum_timeout_s=args.quorum_timeout_s, host="127.0.0.1",
                         commit_every=args.commit_every or None, on_update=on_update, verbose=False)
    heals = group.heals
    with group:
        write("ready")
        while args.go and not Path(args.go).exists():  # the groups begin together (the test says when)
            time.sleep(0.05)
        write("asking")  # its first quorum request follows at once
        for _ in group.epochs(args.epochs):
            for indices in group.micro_batches():
                if group.heals != heals:
                    heals = group.heals
                    write("healed", position=group.updates, params=common.flat(net))
                if group.updates == args.pause_in and "in" not in paused:
                    pause("in", group.updates)
                if args.slow_s and group.updates >= args.slow_from:
                    time.sleep(args.slow_s)
                trained.extend(indices)
                loss = torch.nn.functional.cross_entropy(net(x[indices]), y[indices])
                if args.path == "trace":
                    loss.backward()
                else:
                    with optimizer.accumulate(samples=len(indices)):
                        loss.backward()
                optimizer.step()
    write("done", position=group.updates, committed=group.committed, aborted=group.aborted, heals=group.heals)


if __name__ == "__main__":
    main()
