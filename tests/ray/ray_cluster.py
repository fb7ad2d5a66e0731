"""The driver's side of a local Ray cluster, for tests/ray and benchmarks/resize_ray.py: the
settings its nodes and Ray Train's controller read (:data:`RAY_SETTINGS`), its nodes
(:class:`Nodes`, added and lost like machines) and a ``trainer.fit()`` running while the caller
acts on them (:class:`Fit`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Ray's workers import the tests' helpers and this checkout of aikit
WORKER_PATH = os.pathsep.join(str(p) for p in (ROOT, HERE, ROOT / "tests" / "resize", ROOT / "tests" / "torch"))
# this process's environment while a cluster runs: its nodes inherit it, and Ray Train's
# controller reads the RAY_TRAIN_ variables (the driver passes those it sees on to the workers)
RAY_SETTINGS = {
    "PYTHONPATH": WORKER_PATH,
    "OMP_NUM_THREADS": "1",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # how often the controller polls the workers (2 s by default)
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30",  # a start that waits for a lost node's CPU (60 s by default)
    "RAY_DEDUP_LOGS": "0",
}
# node liveness: a lost node is declared dead after 3 missed 1 s checks (Ray's default: 5 x 3 s)
HEAD_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@contextlib.contextmanager
def ray_settings(settings: dict[str, str] = RAY_SETTINGS):
    """This process's environment as Ray's nodes and controller must see it, put back after, with
    a temp directory of its own (``RAY_TMPDIR``, removed after): Ray's sessions, sockets and the
    file that names the "current" cluster (``ray_current_cluster``) are this cluster's alone, so
    two clusters at once (pytest-xdist's workers, another Ray on the machine) never meet. Short,
    under /tmp: Ray's socket paths inside it must stay under the 107 bytes a Unix socket takes."""
    temp = tempfile.mkdtemp(prefix="aikit-ray-", dir="/tmp")
    settings = {**settings, "RAY_TMPDIR": temp}
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(temp, ignore_errors=True)


def start_local(num_cpus: int):
    """One node of ``num_cpus`` CPUs, this driver connected: a cluster of its own, never one found
    running (``address="local"``: ``ray.init()`` alone joins the cluster the machine's
    ``ray_current_cluster`` names, or warns of several, "Connecting to latest cluster")."""
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    return ray


def start_nodes(system_config: dict = HEAD_SYSTEM_CONFIG) -> Nodes:
    """A local cluster (``ray.cluster_utils.Cluster``) of a head node without CPUs, this driver
    connected to it; add worker nodes with :meth:`Nodes.add` or :meth:`Nodes.keep`."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "_system_config": system_config})
    ray.init(address=cluster.address)  # this cluster's address, never one found running
    return Nodes(cluster)


def elastic_trainer(loop, run_dir: Path, config: dict, name: str, max_failures: int = 3, monitor_s: float = 1.0):
    """A ``TorchTrainer`` of ``loop`` on 1 to 2 workers, its storage in ``run_dir``/storage, Ray
    looking for more workers every ``monitor_s`` seconds (``elastic_resize_monitor_interval_s``)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        loop, train_loop_config={"run_dir": str(run_dir), **config},
        scaling_config=ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=monitor_s),
        run_config=RunConfig(storage_path=str(run_dir / "storage"), name=name,
                             failure_config=FailureConfig(max_failures=max_failures)))


class Nodes:
    """A head node (no CPU: Ray Train's controller) and worker nodes of one CPU each, one Ray
    Train worker per node: a node lost is a machine gone, its worker with it."""

    def __init__(self, cluster):
        self.cluster = cluster

    def add(self):
        return self.cluster.add_node(num_cpus=1)

    def lose(self, worker_pid: int) -> None:
        """SIGKILL the worker ``worker_pid`` and every process of its node."""
        node = self.node_of(worker_pid)
        os.kill(worker_pid, 9)
        self.cluster.remove_node(node, allow_graceful=False)

    def node_of(self, worker_pid: int):
        parent = int(Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        for node in self.cluster.worker_nodes:
            if any(info.process.pid == parent for info in node.all_processes.get("raylet", [])):
                return node
        raise AssertionError(f"no worker node runs the Ray worker {worker_pid} (its parent is {parent})")

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()

    def keep(self, count: int) -> None:
        """Exactly ``count`` worker nodes from now on."""
        while len(self.cluster.worker_nodes) > count:
            self.cluster.remove_node(next(iter(self.cluster.worker_nodes)))
        while len(self.cluster.worker_nodes) < count:
            self.add()
        self.cluster.wait_for_nodes()


class Fit(threading.Thread):
    """``trainer.fit()`` in the background, while the test adds and loses nodes: ``result()``
    is its Result, or raises what it raised."""

    def __init__(self, trainer):
        super().__init__(daemon=True)
        self.trainer, self.outcome, self.error = trainer, None, None
        self.start()

    def run(self) -> None:
        try:
            self.outcome = self.trainer.fit()
        except BaseException as error:  # handed to the test
            self.error = error

    def poll(self) -> int | None:
        """None while ``fit()`` runs, then 0 (returned) or 1 (raised): a launcher, to
        ``resize_checks.wait_for``, which stops waiting for what a finished fit can no longer log."""
        return None if self.is_alive() else int(self.error is not None)

    @property
    def returncode(self) -> str:
        return f"{type(self.error).__name__}: {str(self.error)[:2000]}" if self.error is not None else "0"

    def result(self, timeout: float):
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"trainer.fit() did not return in {timeout} s")
        if self.error is not None:
            raise self.error
        return self.outcome
