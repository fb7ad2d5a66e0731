"""AutoLRS under DDP on 2 real gloo processes (torchrun): rank 0 decides, rank 1 follows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("autolrs_ddp_worker.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                   str(WORKER), out]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(2)]


def test_every_rank_steps_at_rank_0s_lrs(ranks):
    rank0, rank1 = ranks
    assert rank0["step_lrs"] == rank1["step_lrs"] == rank0["history_lrs"]
    assert len(set(rank0["step_lrs"])) > 3  # trials really tried different LRs
    assert rank1["history_lrs"] == []  # rank 1's own (differently seeded) controller never decided


def test_every_rank_evaluates_together_and_restores_to_equal_weights(ranks):
    rank0, rank1 = ranks
    assert rank0["val_calls"] == rank1["val_calls"] and len(rank0["val_calls"]) == 3 * 4
    assert rank0["weights"] == rank1["weights"]
