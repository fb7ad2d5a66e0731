"""A local Ray cluster per test module: one node of 2 CPUs (``ray_local``), or a head and worker
nodes of one CPU each that a test adds and loses like machines (``ray_nodes``).

Ray's workers import the tests' helpers (tests/ray, tests/resize, tests/torch) and this checkout
of aikit: the nodes inherit ``PYTHONPATH`` from this process. Without ``ray[train]``, or where a
cluster cannot start, the tests skip with the reason, unless ``AIKIT_REQUIRE_RAY=1`` (set by
scripts/test.sh), where they fail.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from capabilities import skip_or_fail
from ray_cluster import Nodes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "resize"))  # resize_common, resize_checks, resize_worker
WORKER_PATH = os.pathsep.join(str(p) for p in (ROOT, HERE, ROOT / "tests" / "resize", ROOT / "tests" / "torch"))
# Ray Train's controller re-reads these in every run; the nodes inherit them from this process
RAY_SETTINGS = {
    "PYTHONPATH": WORKER_PATH,
    "OMP_NUM_THREADS": "1",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # how often the controller polls the workers (2 s by default)
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30",  # a start that waits for a lost node's CPU (60 s by default)
    "RAY_DEDUP_LOGS": "0",
}
# node liveness: a lost node is declared dead after 3 missed 1 s checks (Ray's default: 5 x 3 s)
HEAD_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def require_ray():
    try:
        import ray
        import ray.train.torch
    except ImportError as error:
        skip_or_fail("RAY", f"ray[train] is not installed ({error}): pip install -r requirements/test.txt")
    return ray


@pytest.fixture(scope="module")
def ray_integration():
    """``aikit.integrations.ray``, in this process (no cluster)."""
    require_ray()
    import aikit.integrations.ray

    return aikit.integrations.ray


@pytest.fixture(scope="module")
def ray_settings():
    """This process's environment as Ray's nodes and controller must see it, put back after."""
    before = {name: os.environ.get(name) for name in RAY_SETTINGS}
    os.environ.update(RAY_SETTINGS)
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def ray_local(ray_settings):
    """One node with 2 CPUs (``ray.init(num_cpus=2)``): two workers of one CPU each."""
    ray = require_ray()
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    except Exception as error:  # whatever stops Ray from starting here
        skip_or_fail("RAY", f"a local Ray cluster cannot start here: {type(error).__name__}: {error}")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_nodes(ray_settings):
    """A local cluster of several nodes (``ray.cluster_utils.Cluster``), for workers to come and go."""
    ray = require_ray()
    from ray.cluster_utils import Cluster

    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "_system_config": HEAD_SYSTEM_CONFIG})
        ray.init(address=cluster.address)
    except Exception as error:  # whatever stops Ray from starting here
        skip_or_fail("RAY", f"a local Ray cluster cannot start here: {type(error).__name__}: {error}")
    yield Nodes(cluster)
    ray.shutdown()
    cluster.shutdown()
