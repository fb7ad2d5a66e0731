"""aikit on TorchFT with real processes: replica groups of one process each (gloo, float64) on an
in-process lighthouse with a 1 s heartbeat, a group SIGKILLed by PID in the middle of an update
or between two, a hung one (SIGSTOP) bounded by the timeout, a relaunched one that heals and
joins, and a timeout shorter than an update refused by name.

Each run is checked from its groups' logs (ft_checks.py): every update of two epochs committed
and equal to the one-process big-batch run (1e-9), its samples trained once over the groups that
committed it, no sample of an epoch lost or repeated, the survivors never restarted. About 20-40 s
a case on a loaded 2-core machine; three groups down to one and back, a full-job restart through
ElasticState and a heartbeat shorter than an update run with AIKIT_TORCHFT_ALL=1.
"""

from __future__ import annotations

import signal
import time

import ft_checks as checks
import ft_common as common
import pytest

from conftest import every_case

pytestmark = pytest.mark.torchft
TRACE_UPDATES, GA_UPDATES = 14, 8  # two epochs of each path


def relaunch(run, group: str) -> None:
    """Start ``group`` into the running job while the holder waits between two updates, then let it go on
    (slowly: the newcomer joins at one of its next quorums, however loaded the machine)."""
    run.start(group, together=False)
    run.wait_for(group, "asking")
    time.sleep(1)
    (run.directory / "resume").touch()


HOLD = ("--pause-s", 120, "--slow-s", 0.25)  # a holder waits for the resume file, then trains slowly


def quorum_sizes(updates: dict[int, list[dict]]) -> list[int]:
    return [len(updates[position]) for position in sorted(updates)]


def test_a_group_killed_in_the_middle_of_an_update_costs_that_update_and_a_relaunched_one_heals(groups):
    run = groups("trace")  # the trace's steps deal 5, 3, 4, 2, 5, 6 micro-batches: 3/2, 2/1, ... over two groups
    run.start("a", "--pause-after", 8, "--slow-from", 9, *HOLD, "--resume", run.directory / "resume")
    run.start("b", "--pause-in", 3, "--pause-s", 120)
    run.begin("a", "b")
    run.wait_for("b", "paused", position=3)  # inside its first micro-batch of update 3; a waits in the update's sum
    run.signal("b", signal.SIGKILL)
    run.wait_for("a", "paused", position=8)  # a trained updates 3..8 alone
    relaunch(run, "b2")
    run.finish("a", "b2")

    updates = checks.check_exact(run, ("a", "b", "b2"))
    checks.check_never_restarted(run, "a", TRACE_UPDATES)
    checks.check_never_restarted(run, "b2", TRACE_UPDATES, healed=True)
    sizes = quorum_sizes(updates)  # b2 joins at the holder's next quorum (or, on a slow machine, a later one)
    assert sizes[:9] == [2, 2, 2] + [1] * 6 and sizes[3:] == sorted(sizes[3:]) and sizes[-1] == 2, sizes
    aborted = [row for row in run.events("a") if row["event"] == "update" and not row["committed"]]
    assert [row["position"] for row in aborted] == [3], "the update b died in is the one update it cost"
    stalled = checks.stall(run, "a", "b")
    assert stalled < 30, "the survivor went on within its heartbeat and one update"
    print(f"a group SIGKILLed mid-update held the other {stalled:.1f} s (heartbeat 1 s)")


def test_the_ga_wrapper_loses_a_group_between_updates_and_keeps_its_global_batch_of_25(groups):
    run = groups("ga")  # 25 samples an update: 13 + 12 over two groups, all 25 on one
    run.start("a", "--pause-after", 4, "--slow-from", 5, *HOLD, "--resume", run.directory / "resume")
    run.start("b", "--pause-after", 1, "--pause-s", 120)
    run.begin("a", "b")
    run.wait_for("b", "paused", position=1)  # b committed update 1 and waits before the next quorum
    run.signal("b", signal.SIGKILL)
    run.wait_for("a", "paused", position=4)
    relaunch(run, "b2")
    run.finish("a", "b2")

    updates = checks.check_exact(run, ("a", "b", "b2"))
    checks.check_never_restarted(run, "a", GA_UPDATES)
    checks.check_never_restarted(run, "b2", GA_UPDATES, healed=True)
    shares = [sorted(len(row["indices"]) for row in updates[p]) for p in range(GA_UPDATES)]
    assert shares[:5] == [[12, 13]] * 2 + [[25]] * 3 and shares[-1] == [12, 13], shares
    assert set(map(tuple, shares[5:])) <= {(25,), (12, 13)}, shares
    assert not [row for row in run.events("a") if row["event"] == "update" and not row["committed"]], (
        "a group lost between updates costs no update")


def test_a_hung_group_holds_the_others_for_the_timeout_then_heals_and_joins_without_a_restart(groups):
    run = groups("trace")
    run.start("a", "--timeout-s", 5, "--pause-after", 9, "--slow-from", 10, *HOLD, "--resume", run.directory / "resume")
    run.start("b", "--timeout-s", 5, "--pause-in", 2, "--pause-s", 1)
    run.begin("a", "b")
    run.wait_for("b", "paused", position=2)
    run.signal("b", signal.SIGSTOP)  # hung in the middle of update 2: its heartbeat stops too
    run.wait_for("a", "paused", position=9)
    stalled = checks.stall(run, "a", "b")
    run.processes["b"].send_signal(signal.SIGCONT)  # b's sum of update 2 fails; it is behind, and heals
    run.wait_for("b", "update", position=2, committed=False)
    time.sleep(1.5)  # its next quorum request is in
    (run.directory / "resume").touch()
    run.finish("a", "b")

    checks.check_exact(run, ("a", "b"))
    checks.check_never_restarted(run, "a", TRACE_UPDATES)
    checks.check_never_restarted(run, "b", TRACE_UPDATES, healed=True)  # the same process, healed
    assert 4 < stalled < 30, f"a hung group holds the others for timeout_s=5, not for ever ({stalled:.1f} s)"
    print(f"a hung group held the other {stalled:.1f} s (timeout_s=5, heartbeat 1 s)")


def test_a_timeout_shorter_than_an_update_is_refused_by_name(groups):
    run = groups("trace")
    run.start("a", "--timeout-s", 1)
    run.start("b", "--timeout-s", 1, "--slow-s", 1.5)  # every micro-batch of b takes 1.5 s: an update 3-4.5 s
    run.begin("a", "b")
    code = run.processes["a"].wait(180)
    output = run.output("a")
    assert code != 0 and "TrainingFailed" in output, output
    assert "timeout_s=1 is shorter than an update takes on the slowest group" in output, output
    assert not [row for row in run.events("a") if row["event"] == "update" and row["committed"]][1:], (
        "no update committed while every one timed out")


@every_case
def test_three_groups_down_to_one_and_back(groups, lighthouse):
    # 5 micro-batches over three groups: 2/2/1; a step of 2 leaves one group idle. The quorum waits for a
    # busy group longer than a holds: two newcomers are more than half of three, and would go on alone
    run = groups("trace", lighthouse(join_ms=60_000))
    run.start("a", "--pause-after", 9, "--slow-from", 10, *HOLD, "--resume", run.directory / "resume")
    run.start("b", "--pause-in", 2, "--pause-s", 120)
    run.start("c", "--pause-after", 4, "--pause-s", 120)
    run.begin("a", "b", "c")
    run.wait_for("b", "paused", position=2)
    run.signal("b", signal.SIGKILL)  # mid-update: a and c go on
    run.wait_for("c", "paused", position=4)
    run.signal("c", signal.SIGKILL)  # between updates: a alone
    run.wait_for("a", "paused", position=9)
    run.start("b2", together=False)
    run.start("c2", together=False)
    run.wait_for("b2", "asking")
    run.wait_for("c2", "asking")
    time.sleep(1)
    (run.directory / "resume").touch()
    run.finish("a", "b2", "c2")

    updates = checks.check_exact(run, ("a", "b", "c", "b2", "c2"))
    checks.check_never_restarted(run, "a", TRACE_UPDATES)
    assert {len(updates[p]) for p in range(10)} == {1, 2, 3} and len(updates[TRACE_UPDATES - 1]) == 3


@every_case
def test_a_restart_of_the_whole_job_goes_on_from_the_elastic_states_commit(groups):
    run = groups("trace")
    run.start("a", "--commit-every", 2, "--pause-after", 6, "--pause-s", 120)
    run.start("b", "--commit-every", 2, "--pause-after", 6, "--pause-s", 120)
    run.begin("a", "b")
    run.wait_for("a", "paused", position=6)
    run.wait_for("b", "paused", position=6)
    for group in ("a", "b"):
        run.signal(group, signal.SIGKILL)  # every group lost: the lighthouse's quorum with them
    run.go.unlink()
    run.start("a2", "--restore", 1)
    run.start("b2", "--restore", 1)
    run.begin("a2", "b2")
    run.finish("a2", "b2")

    assert all(row["found"] for group in ("a2", "b2") for row in run.events(group) if row["event"] == "restored")
    restarted = checks.committed(run, ("a2", "b2"))
    assert min(restarted) == 6, "the restart goes on after commit 3 (update 6), the last one written"
    before = {p: rows for p, rows in checks.committed(run, ("a", "b")).items() if p < 6}
    run_updates = {**before, **restarted}
    reference = common.reference("trace", 2)
    assert sorted(run_updates) == list(range(TRACE_UPDATES))
    for position, rows in run_updates.items():
        assert max(common.worst_difference(row["params"], reference[position]["params"]) for row in rows) < 1e-9


@every_case
def test_a_heartbeat_shorter_than_an_update_trains_exactly(groups, lighthouse):
    run = groups("trace", lighthouse(heartbeat_ms=200))  # TorchFT's heartbeats come from a thread of their own
    run.start("a", "--slow-s", 0.4)
    run.start("b", "--slow-s", 0.4)  # an update takes 0.8-1.2 s, five heartbeats
    run.begin("a", "b")
    run.finish("a", "b")
    checks.check_exact(run, ("a", "b"))
    for group in ("a", "b"):
        assert not [row for row in run.events(group) if row["event"] == "update" and not row["committed"]]
