"""What every TorchFT run is checked for, from its groups' event logs: every update of the run
committed, each equal to the one-process big-batch run (1e-9, float64), its samples trained once
over the groups that committed it, each epoch's samples once; a group that never restarted
committed every update from the one it began (or healed) at to the end."""

from __future__ import annotations

import ft_common as common

TOLERANCE = 1e-9


def committed(run, groups: tuple[str, ...]) -> dict[int, list[dict]]:
    """Every committed update of ``groups``, by position."""
    found: dict[int, list[dict]] = {}
    for group in groups:
        for row in run.events(group):
            if row["event"] == "update" and row["committed"]:
                found.setdefault(row["position"], []).append(row)
    return found


def check_exact(run, groups: tuple[str, ...], epochs: int = 2) -> dict[int, list[dict]]:
    reference = common.reference(run.path, epochs)
    updates = committed(run, groups)
    assert sorted(updates) == list(range(len(reference))), "an update of the run was not committed, or one too many"
    for position, rows in updates.items():
        for row in rows:
            worst = common.worst_difference(row["params"], reference[position]["params"])
            assert worst < TOLERANCE, f"update {position} on {row['id']} differs from the big batch by {worst:.2e}"
        trained = sorted(index for row in rows for index in row["indices"])
        assert trained == reference[position]["indices"], (
            f"update {position}: the groups that committed it trained {trained}, its global batch is "
            f"{reference[position]['indices']}")
        assert {row["replicas"] for row in rows} == {len(rows)}, f"update {position}: a group of the quorum is missing"
    for epoch in range(epochs):
        seen = [i for p, rows in updates.items() if reference[p]["epoch"] == epoch
                for row in rows for i in row["indices"]]
        expected = [i for row in reference if row["epoch"] == epoch for i in row["indices"]]
        assert len(seen) == len(set(seen)), f"epoch {epoch}: a sample trained twice"
        assert sorted(seen) == sorted(expected), f"epoch {epoch}: a sample lost"
    return updates


def check_never_restarted(run, group: str, total: int, healed: bool = False) -> list[int]:
    """``group`` started once and committed every update from its first to the last (after a
    heal, from where it healed); returns its positions."""
    events = run.events(group)
    assert [row["event"] for row in events].count("start") == 1 and len({row["pid"] for row in events}) == 1
    positions = [row["position"] for row in events if row["event"] == "update" and row["committed"]]
    heals = [row["position"] for row in events if row["event"] == "healed" and row["position"] > 0]
    if healed:
        assert heals, f"{group} never healed"
        after = [p for p in positions if p >= heals[-1]]
        assert after == list(range(heals[-1], total)), f"{group} after its heal at {heals[-1]}: {after}"
    else:
        assert not heals, f"{group} healed at {heals}: it fell behind"
        assert positions == list(range(positions[0], total)), f"{group} skipped updates: {positions}"
    assert events[-1]["event"] == "done" and events[-1]["position"] == total
    return positions


def stall(run, survivor: str, victim: str) -> float:
    """Seconds from the victim's kill (or stop) to the survivor's next committed update: the first
    after the last the victim committed (the survivor may log that one after the kill)."""
    killed = run.kills[victim]
    last = max([row["position"] for row in run.events(victim) if row["event"] == "update" and row["committed"]],
               default=-1)
    after = [row["time"] for row in run.events(survivor)
             if row["event"] == "update" and row["committed"] and row["position"] > last]
    return min(after) - killed
