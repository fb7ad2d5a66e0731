"""Two local Ray clusters at once never meet (issue 47): pytest-xdist's two workers each start one,
and another Ray may run on the machine. Each cluster of tests/ray has a temp directory of its own
(``RAY_TMPDIR``: its sessions, sockets and the ``ray_current_cluster`` file a bare ``ray.init()``
follows) and starts at an address of its own (``ray.init(address="local")``), where the suite's
``ray.init(num_cpus=2)`` had joined whichever cluster that file named ("Found multiple active Ray
instances ... Connecting to latest cluster")."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ray_cluster import HERE, start_local

pytestmark = [pytest.mark.slow, pytest.mark.ray]

OTHER = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(HERE)!r})
    from ray_cluster import start_nodes
    nodes = start_nodes()  # a Cluster: it names itself in RAY_TMPDIR's ray_current_cluster
    print(nodes.cluster.address, flush=True)
    sys.stdin.read()  # until the test is done
    nodes.shutdown()
""")


def test_a_cluster_started_beside_another_is_its_own(ray_integration, ray_environment):
    import ray

    temp = Path(os.environ["RAY_TMPDIR"])  # the module's (ray_cluster.ray_settings)
    other = subprocess.Popen([sys.executable, "-c", OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = other.stdout.readline().strip()
        assert theirs, "the other cluster did not start"
        assert (temp / "ray" / "ray_current_cluster").read_text().strip() == theirs
        start_local(2)  # in the same temp directory: where a bare ray.init() would join the other
        try:
            assert ray.get_runtime_context().gcs_address != theirs  # a cluster of its own
            session = Path(ray._private.worker.global_worker.node.get_session_dir_path())
            assert temp / "ray" in session.parents
            assert ray.cluster_resources()["CPU"] == 2  # not the other's head of 0 CPUs
        finally:
            ray.shutdown()
    finally:
        other.stdin.close()
        other.wait(timeout=300)
