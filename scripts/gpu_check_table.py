"""The GPU check's table, which scripts/gpu_check.sh prints last, and its verdict.

One line per part the script ran (its exit status and time), per test group of tests/cuda (a
file: what passed on each device) and per benchmark figure (with its goal). The tests are read from
pytest's ``-v`` log, one line per test as it ends, so a run cut short by its time limit still counts
what finished and names the test it stopped in; the benchmark from its ``--json``.

    python scripts/gpu_check_table.py LOGS --mode cuda --part tests=0/95/300 --part benchmark=0/61/150

Exit status 0 when every part passed: the tests (failures and errors fail; skips pass, so on the
CPU the CUDA cases are not missed), the benchmark (an error fails it, and on a GPU a missed goal).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

RESULT = re.compile(r"^tests/cuda/(?P<file>\w+)\.py::(?P<test>.+?) "
                    r"(?P<status>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
FINISHED = re.compile(r"^=+ .*\bin [0-9.]+s")  # pytest's last line: "== 19 passed, ... in 24.56s =="
TIMED_OUT = {124, 137}  # timeout's status, and a kill after its grace period


def tests_by_group(log: Path) -> tuple[dict, str | None]:
    """{group: {device: {status: count}}} from the pytest log, and the test running when it ended
    (None when the log ends after a result)."""
    groups: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    for line in lines:
        found = RESULT.match(line)
        if found:
            params = re.search(r"\[(.*)\]$", found["test"])
            device = next((part for part in (params[1].split("-") if params else []) if part in ("cpu", "cuda")), "-")
            groups[found["file"].removeprefix("test_")][device][found["status"]] += 1
    cut_short = lines and not FINISHED.match(lines[-1]) and lines[-1].startswith("tests/cuda/")
    return groups, lines[-1].strip() if cut_short and not RESULT.match(lines[-1]) else None


def cell(counts: dict) -> str:
    if not counts:
        return "-"
    names = {"PASSED": "ok", "FAILED": "FAILED", "ERROR": "ERROR", "SKIPPED": "skipped", "XFAIL": "xfail",
             "XPASS": "XPASS"}
    return " ".join(f"{counts[status]} {name}" for status, name in names.items() if counts.get(status))


def verdict(devices: dict) -> str:
    statuses = {status for counts in devices.values() for status, n in counts.items() if n}
    if statuses & {"FAILED", "ERROR", "XPASS"}:
        return "FAIL"
    return "skip" if statuses <= {"SKIPPED"} else "PASS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", type=Path)
    parser.add_argument("--mode", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--part", action="append", default=[], help="NAME=STATUS/SECONDS/LIMIT")
    parser.add_argument("--device", default="", help="what ran it, for the title")
    args = parser.parse_args()
    parts = {}
    for part in args.part:
        name, figures = part.split("=")
        status, seconds, limit = (int(x) for x in figures.split("/"))
        parts[name] = status, seconds, limit
    lines, failed = [], False

    def row(name: str, figure: str, result: str) -> None:
        nonlocal failed
        failed |= result in ("FAIL", "TIMEOUT")
        lines.append(f"{name:<44} {figure:<38} {result}")

    lines.append(f"aikit GPU check, {args.mode} mode: {args.device}".rstrip(": "))
    lines.append(f"{'part / group':<44} {'figure':<38} result")
    for name, (status, seconds, limit) in parts.items():
        result = "TIMEOUT" if status in TIMED_OUT else "PASS" if status == 0 else "FAIL"
        row(name, f"exit {status} after {seconds} s (limit {limit} s)", result)
    groups, running = tests_by_group(args.logs / "tests.log")
    for group in sorted(groups):
        devices = groups[group]
        row(f"  tests: {group}", f"cpu {cell(devices.get('cpu', {}))}; cuda {cell(devices.get('cuda', {}))}",
            verdict(devices))
    if not groups:
        row("  tests", "no result in tests.log", "FAIL")
    if running:
        row("  tests: stopped in", running.split("::", 1)[-1], "FAIL")
    bench = args.logs / "bench.json"
    if bench.exists():
        report = json.loads(bench.read_text())
        required = report.get("goals_required", False)
        for entry in report["rows"]:
            figure = entry.get("value") or (entry["detail"] if entry.get("ratio") is None else f"{entry['ratio']:.3f}")
            if "goal" in entry:
                goal = entry["goal"]
                figure += f" (goal {'<= ' if isinstance(goal, float) else ''}{goal})"
            met = entry.get("met")
            result = ("FAIL" if "error" in entry else "-" if met is None
                      else "PASS" if met else "FAIL" if required else "miss (CPU)")
            row(f"  bench: {entry['name']}", figure, result)
    else:
        row("  bench", "no bench.json", "FAIL")
    lines.append(f"{'overall':<44} {'':<38} {'FAIL' if failed else 'PASS'}")
    table = "\n".join(lines)
    print(table)
    (args.logs / "table.txt").write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
