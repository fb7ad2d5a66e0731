"""A local Ray cluster per test module: one node of 2 CPUs (``ray_local``), or a head and worker
nodes of one CPU each that a test adds and loses like machines (``ray_nodes``).

Ray's workers import the tests' helpers (tests/ray, tests/resize, tests/torch) and this checkout
of aikit: the nodes inherit ``PYTHONPATH`` from this process. Without ``ray[train]``, or where a
cluster cannot start, the tests skip with the reason, unless ``AIKIT_REQUIRE_RAY=1`` (set by
scripts/test.sh), where they fail.
"""

from __future__ import annotations

import sys

import pytest
from capabilities import skip_or_fail
from ray_cluster import ROOT, ray_settings, start_local, start_nodes

sys.path.insert(0, str(ROOT / "tests" / "resize"))  # resize_common, resize_checks, resize_worker


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
def ray_environment():
    """ray_cluster.RAY_SETTINGS in this process's environment for the module, and a temp directory
    of the module's own: its cluster meets no other (ray_cluster.ray_settings)."""
    with ray_settings():
        yield


@pytest.fixture(scope="module")
def ray_local(ray_environment):
    """One node with 2 CPUs (``ray.init(address="local", num_cpus=2)``): two workers of one CPU each."""
    ray = require_ray()
    try:
        start_local(2)
    except Exception as error:  # whatever stops Ray from starting here
        skip_or_fail("RAY", f"a local Ray cluster cannot start here: {type(error).__name__}: {error}")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_nodes(ray_environment):
    """A local cluster of several nodes (``ray.cluster_utils.Cluster``), for workers to come and go."""
    require_ray()
    try:
        nodes = start_nodes()
    except Exception as error:  # whatever stops Ray from starting here
        skip_or_fail("RAY", f"a local Ray cluster cannot start here: {type(error).__name__}: {error}")
    yield nodes
    nodes.shutdown()
