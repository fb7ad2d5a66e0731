"""A real two-worker MultiWorkerMirroredStrategy run on localhost, found from TF_CONFIG:
init plans over both workers and GA in a strategy.run loop equals one-device big batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_ports

WORKER = Path(__file__).parent / "multiworker_worker.py"


@pytest.mark.slow
def test_two_workers_from_tf_config_equal_one_device_big_batch():
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    workers = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        workers.append(subprocess.Popen([sys.executable, str(WORKER)], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True))
    outputs = [worker.communicate(timeout=300) for worker in workers]
    results = []
    for worker, (out, err) in zip(workers, outputs, strict=True):
        lines = [line for line in out.splitlines() if line.startswith("RESULTS ")]
        assert worker.returncode == 0 and lines, out[-2000:] + err[-4000:]
        results.append(json.loads(lines[-1][len("RESULTS "):]))
    for rank, result in enumerate(results):
        assert result["multi_worker"]
        assert result["plan"] == [2, 4, 2, 16]  # 2 GA steps x 4 samples x 2 workers
        assert result["master"] == (rank == 0)
        assert result["updates"] == 2  # 32 samples, updates of 16
        assert result["difference"] < 1e-12
