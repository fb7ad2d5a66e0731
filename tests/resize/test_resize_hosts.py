"""torchrun across two hosts (network namespaces, tests/multihost.py), one worker each, gloo over
the hosts' own addresses, the checkpoint directory on storage both see: host A keeps the c10d
rendezvous, host B joins it. The agents run the commands docs/resize.md ("Several hosts") shows,
read from it, with only the addresses, the interface and the script filled in and the
rendezvous' timings shortened.

B gets the lower address, so torchrun makes it rank 0: the host that is lost or cut off is the one
that writes the commits. Faults: B's every process SIGKILLed mid-epoch (A goes on alone with the
same global batches, twice the micro-batches per update, and a new agent on B is admitted later);
B's link cut for longer than the collective timeout and then restored (both sides fail in the
collective after the timeout with a CollectiveError, A goes on alone, B never commits while cut
off, and B comes back by itself when the link does); A, the rendezvous host, SIGKILLed (B's agent
ends: the recovery is to start the rendezvous again on B, as the docs say, and A joins it later).
Each run trains every step of every epoch once, on exactly its global batch, and ends at the
weights of the uninterrupted big-batch run (float64).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import multihost
import pytest
from resize_checks import (
    WORKER,
    check_accounting,
    check_final_weights,
    commits,
    prepare,
    records,
    tail,
    wait_for,
    worker_env,
)
from resize_common import MINIBATCH, SEED, N, total_steps, trace

from aikit.core.schedule import Schedule

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "resize.md"
SECTION = "## Several hosts"
DOCUMENTED = {"10.0.0.1": "a", "10.0.0.2": "b"}  # the docs' hosts A and B
TIMEOUT = 10  # seconds: the workers' process group timeout, how long a collective waits for a silent peer
# what the tests add to the documented --rdzv-conf: a dead node noticed after 1 s x 4, rounds closed after 1 s
FAST_RENDEZVOUS = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=4"
STEP_DELAY, SOLO_DELAY = 0.25, 2.0  # seconds after each update: in pairs, and alone (so that B finds A running)


def documented_agent(host: str, rendezvous: str) -> tuple[dict[str, str], list[str]]:
    """The docs' torchrun command for ``host`` ("A" or "B") with the rendezvous on ``rendezvous``."""
    endpoint = next(address for address, name in DOCUMENTED.items() if name == rendezvous.lower())
    for on, env, argv in multihost.documented_commands(DOCS, SECTION):
        if on == host and argv[0] == "torchrun" and f"--rdzv-endpoint={endpoint}:29400" in argv:
            return env, argv
    raise AssertionError(f"{DOCS} ({SECTION}) shows no torchrun command for host {host} with the rendezvous "
                         f"on {rendezvous}")


def agent(net: multihost.Network, host: str, rendezvous: str, run_dir: Path, log: str):
    """Start the documented agent on ``host`` of ``net``: the docs' addresses become the test
    hosts', eth0 their interface, train.py the resize worker."""
    env, argv = documented_agent(host, rendezvous)
    addresses = {address: net[name].address for address, name in DOCUMENTED.items()}

    def fill(word: str) -> str:
        word = re.sub("|".join(map(re.escape, addresses)), lambda found: addresses[found[0]], word)
        return word + f",{FAST_RENDEZVOUS}" if word.startswith("--rdzv-conf=") else word

    script = argv.index("train.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--monitor-interval=0.1",
               *map(fill, argv[1:script]), str(WORKER), str(run_dir), f"--delay={STEP_DELAY}",
               f"--solo-delay={SOLO_DELAY}", f"--timeout={TIMEOUT}"]
    env = {**worker_env(), **{key: value.replace("eth0", multihost.INTERFACE) for key, value in env.items()},
           "AIKIT_TEST_HOST": host.lower()}
    return net[host.lower()].popen(command, log=run_dir / f"{log}.log", env=env)


def hosts(network) -> multihost.Network:
    """Hosts b (10.231.0.1, rank 0) and a (10.231.0.2, the rendezvous)."""
    return network(names=["b", "a"])


def committed(world: int, at_least: int = 1, after: float = 0.0):
    return lambda recs: sum(c["world"] == world and c["t"] > after for c in commits(recs)) >= at_least


def finish(procs, run_dir: Path, timeout: float = 120) -> None:
    for proc in procs:
        try:
            code = proc.wait(timeout=timeout)
        except Exception:
            raise AssertionError(f"the run did not finish in {timeout}s:\n{tail(run_dir)}") from None
        assert code == 0, f"an agent exited with {code}:\n{tail(run_dir)}"


def check_run(run_dir: Path, x, y, worlds: set[int]) -> float:
    """Every sample of each epoch trained once on its global batch; alone, one worker takes every
    micro-batch of a step (twice its share in a pair); the final weights are the big-batch run's."""
    recs = records(run_dir)
    steps = check_accounting(recs)
    assert {entry["world"] for entry in steps.values()} == worlds
    schedule = Schedule(trace(), N, 1, MINIBATCH, SEED)
    for (epoch, step), entry in steps.items():
        micro = len(schedule.epoch(epoch).step_indices(step)) // MINIBATCH
        per_worker = {rank: len(ids) // MINIBATCH for rank, ids in entry["ids"].items()}
        assert max(per_worker.values()) == -(-micro // entry["world"]), (epoch, step, per_worker)
    return check_final_weights(run_dir, x, y, total_steps())


def test_host_b_killed_mid_epoch_a_goes_on_alone_and_a_new_agent_on_b_is_admitted(network, tmp_path):
    net, (x, y) = hosts(network), prepare(tmp_path)
    a = agent(net, "A", "A", tmp_path, "agent_a")
    b = agent(net, "B", "A", tmp_path, "agent_b")
    recs = wait_for(committed(2, 2), tmp_path, 90, [a, b], "two updates by 2 workers")
    assert {c["host"] for c in commits(recs)} == {"b"}  # b is rank 0: it writes the commits
    killed_at = time.time()
    assert net["b"].kill() >= 2  # the agent and its worker, every process of host b
    wait_for(committed(1), tmp_path, 60, [a], "an update by a alone")
    rejoined_at = time.time()
    b = agent(net, "B", "A", tmp_path, "agent_b_again")
    wait_for(committed(2, after=rejoined_at), tmp_path, 90, [a, b], "an update by 2 workers after b rejoined")
    finish([a, b], tmp_path)
    recs = records(tmp_path)
    alone = min((c for c in commits(recs) if c["world"] == 1), key=lambda c: c["t"])
    back = min((c for c in commits(recs) if c["world"] == 2 and c["t"] > rejoined_at), key=lambda c: c["t"])
    assert alone["updates"] < 7, "b was not lost mid-epoch 0"
    assert back["updates"] < total_steps(), "b was admitted too late to train"
    difference = check_run(tmp_path, x, y, {1, 2})
    print(f"\nhost b killed: a's first update alone {alone['t'] - killed_at:.1f} s after the kill; b's new agent "
          f"admitted, first update in a pair {back['t'] - rejoined_at:.1f} s after it started; final weights "
          f"within {difference:.1e} of the big-batch run")


def check_no_commit_while_cut_off(recs: list[dict], cut_at: float) -> None:
    """Host b, cut off at ``cut_at``, commits nothing of its own: whatever it commits after the
    cut is an update a made with it before the cut (an all-reduce that finished as the link went
    down), never one made alone."""
    with_a = {(r["inc"], r["updates"]) for r in recs if r["event"] == "update" and r["host"] == "a"
              and r["t"] < cut_at + 1}
    late = [(r["inc"], r["updates"]) for r in recs if r["event"] == "committing" and r["host"] == "b"
            and r["t"] > cut_at]
    assert set(late) <= with_a, f"b, cut off, committed updates {sorted(set(late) - with_a)} (incarnation, update)"


def test_host_b_cut_off_longer_than_the_timeout_the_job_shrinks_and_grows_back_when_the_link_returns(network, tmp_path):
    net, (x, y) = hosts(network), prepare(tmp_path)
    a = agent(net, "A", "A", tmp_path, "agent_a")
    b = agent(net, "B", "A", tmp_path, "agent_b")
    wait_for(committed(2, 2), tmp_path, 90, [a, b], "two updates by 2 workers")
    net["b"].cut()
    cut_at = time.time()
    time.sleep(TIMEOUT + 5)  # the link stays down longer than the timeout
    check_no_commit_while_cut_off(records(tmp_path), cut_at)
    wait_for(committed(1), tmp_path, 60, [a, b], "an update by a alone")
    net["b"].restore()
    restored_at = time.time()
    wait_for(committed(2, after=restored_at), tmp_path, 90, [a, b], "an update by 2 workers after the link returned")
    finish([a, b], tmp_path)
    recs = records(tmp_path)
    alone = min((c for c in commits(recs) if c["world"] == 1), key=lambda c: c["t"])
    back = min((c for c in commits(recs) if c["world"] == 2 and c["t"] > restored_at), key=lambda c: c["t"])
    assert alone["t"] - cut_at < TIMEOUT + 60, "a hung: it went on alone long after the timeout"  # a restart: seconds
    check_no_commit_while_cut_off([r for r in recs if r["t"] < restored_at], cut_at)
    for log in ("agent_a", "agent_b"):  # both sides' collective ended with the named error within the timeout
        text = (tmp_path / f"{log}.log").read_text()
        found = re.search(r"CollectiveError: an all-reduce of \d+ tensor\(s\) over torch\.distributed failed on "
                          r"rank \d of 2 after ([\d.]+) s: no answer within the timeout.*?"
                          rf"init_process_group\(timeout=\.\.\.\), {TIMEOUT} s here", text)
        assert found, f"{log}: no CollectiveError naming the {TIMEOUT} s timeout:\n{text[-3000:]}"
        assert TIMEOUT - 0.5 <= float(found[1]) <= TIMEOUT + 5, f"{log} waited {found[1]} s"
    difference = check_run(tmp_path, x, y, {1, 2})
    print(f"\nhost b cut off: a's first update alone {alone['t'] - cut_at:.1f} s after the cut (timeout {TIMEOUT} s); "
          f"link down {restored_at - cut_at:.1f} s; first update "
          f"in a pair {back['t'] - restored_at:.1f} s after the link returned; final weights within "
          f"{difference:.1e} of the big-batch run")


def test_the_rendezvous_host_killed_b_stops_and_the_rendezvous_started_again_on_b_resumes(network, tmp_path):
    net, (x, y) = hosts(network), prepare(tmp_path)
    a = agent(net, "A", "A", tmp_path, "agent_a")
    b = agent(net, "B", "A", tmp_path, "agent_b")
    wait_for(committed(2, 2), tmp_path, 90, [a, b], "two updates by 2 workers")
    killed_at = time.time()
    net["a"].kill()  # the host that keeps the rendezvous store
    try:
        code = b.wait(timeout=120)
    except Exception:
        raise AssertionError(f"b's agent did not end after the rendezvous host died:\n{tail(tmp_path)}") from None
    ended = time.time()
    assert code != 0
    assert "RendezvousConnectionError" in (tmp_path / "agent_b.log").read_text()
    last = max(c["updates"] for c in commits(records(tmp_path)))
    assert last < 7, "a was not lost mid-epoch 0"
    b = agent(net, "B", "B", tmp_path, "agent_b_rendezvous")  # the recovery: the rendezvous on b
    wait_for(committed(1), tmp_path, 90, [b], "an update by b alone")
    rejoined_at = time.time()
    a = agent(net, "A", "B", tmp_path, "agent_a_again")  # a is back: it joins b's rendezvous
    wait_for(committed(2, after=rejoined_at), tmp_path, 90, [a, b], "an update by 2 workers after a rejoined")
    finish([a, b], tmp_path)
    recs = records(tmp_path)
    resumed = min((r for r in recs if r["event"] == "start" and r["world"] == 1), key=lambda r: r["t"])
    assert resumed["restored"]["commit"] == last  # from the last commit, nothing lost
    difference = check_run(tmp_path, x, y, {1, 2})
    print(f"\nrendezvous host a killed: b's agent ended (exit {code}) {ended - killed_at:.1f} s after the kill; "
          f"restarted with the rendezvous on b, it resumed commit {last}; final weights within {difference:.1e} "
          "of the big-batch run")
