"""Running a multi-process launcher (torchrun, horovodrun) for a test or a documented block.

gloo's threads have aborted a worker at process exit on rare runs ("terminate called without an
active exception"), after its work was done; such a run gets one rerun, reported as a warning
with the first run's output and its Python stacks (PYTHONFAULTHANDLER). A crash that repeats, or
any other failure, is returned as it is for the caller to fail on."""

from __future__ import annotations

import re
import signal
import subprocess
import warnings

import pytest

CRASH_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS}


def crashed_worker(output: str) -> str | None:
    """The signal that killed a worker, read from torchrun's or horovodrun's report, or None."""
    found = re.search(r"Root Cause.*?exitcode\s*:\s*-(\d+)", output, re.S)  # torchrun
    code = int(found[1]) if found else None
    for status in re.findall(r"exit with status code (\d+)", output):  # horovodrun: 128 + signal
        code = code or (int(status) - 128 if int(status) > 128 else None)
    return signal.Signals(code).name if code in CRASH_SIGNALS else None


def run_launcher(name: str, command: list[str], env: dict[str, str], **options) -> subprocess.CompletedProcess:
    """``subprocess.run(command)`` with output captured, once more if a worker died of a signal."""
    env = {**env, "PYTHONFAULTHANDLER": "1"}
    for attempt in range(2):
        done = subprocess.run(command, env=env, capture_output=True, text=True, **options)
        killed = crashed_worker(done.stdout + done.stderr) if done.returncode else None
        if not killed or attempt:
            return done
        warnings.warn(f"{name}: a worker died of {killed}; running it once more. Its output:\n"
                      f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}", pytest.PytestWarning, stacklevel=3)
    return done
