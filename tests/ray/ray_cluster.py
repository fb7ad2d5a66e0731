"""The test's side of a local Ray cluster: its nodes (:class:`Nodes`, added and lost like
machines) and a ``trainer.fit()`` running while the test acts on them (:class:`Fit`)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


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

    def result(self, timeout: float):
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"trainer.fit() did not return in {timeout} s")
        if self.error is not None:
            raise self.error
        return self.outcome
