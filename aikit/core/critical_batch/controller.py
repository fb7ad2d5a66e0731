"""The probe policy as an adaptive run's controller: :class:`ProbeController`.

A :class:`~aikit.core.goodput.GoodputController` whose batch the :class:`ProbePolicy` sets
instead of the goodput model: the adaptive run's packing, trace, LR column, replay and resume
(:mod:`aikit.core.adaptive`, ``AdaptiveSampler``/``AdaptiveOptimizer``) serve it unchanged, and
the gradient noise is still measured and logged, as a diagnostic beside the probe's estimate.
"""

from __future__ import annotations

import copy

import numpy as np

from aikit.core.critical_batch.policy import ProbePolicy
from aikit.core.critical_batch.probe import Branches
from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.goodput import GoodputController

PROBED_NOISE_EVERY = 64
"""A probed run measures the noise on every 64th update only (an adapter's default): there it is a
logged diagnostic, not what decides, and each measurement costs an update one more micro-step."""


class ProbeController(GoodputController):
    """Moves the batch where the probes say, after an update (:meth:`propose`), once the adapter
    attached its :class:`Branches` (:meth:`attach`). ``batch_policy`` first; other arguments as
    :class:`~aikit.core.goodput.GoodputController`'s."""

    def __init__(self, batch_policy: ProbePolicy, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(batch_policy, ProbePolicy):
            raise InvalidValue(f"ProbeController needs a ProbePolicy, got {batch_policy!r:.60}")
        self.batch_policy = batch_policy
        self.branches: Branches | None = None

    def attach(self, branches: Branches) -> None:
        """The adapter's training, which the probes branch from (checked now, not when a probe runs)."""
        missing = [name for name in ("snapshot", "restore", "train", "evaluate") if not callable(getattr(branches, name,
                                                                                                        None))]
        if missing or not isinstance(getattr(branches, "dataset_size", None), int):
            raise InvalidType(
                f"controller.attach() takes the training a probe branches from (snapshot, restore, train, evaluate "
                f"and dataset_size: aikit.core.critical_batch.Branches), got {type(branches).__name__} "
                f"{branches!r:.60}: PyTorch: aikit.elastic.Torch.TorchBranches(model, optimizer, losses, dataset, "
                "held_out); Keras: aikit.keras.elastic.KerasBranches")
        self.branches = branches

    def lr_scale(self) -> float:
        return self.batch_policy.lr_scale

    def decisions(self) -> list[tuple]:
        """Every probe's decision so far (not its CPU time, each replica's own)."""
        return [(row["samples"], row["batch"], row["critical_batch"], row["rule"], row["lr_scale"], row["resolved"])
                for row in self.batch_policy.rows]

    def refusal(self, problem: str) -> str | None:
        if "probe decisions (" not in problem:
            return None
        return (f"the replicas' critical-batch probes decided differently by update {len(self.batches) - 1} "
                f"({problem}): each replica probes alone, so it must branch on the same data as every other: give "
                "TorchBranches the whole training set and the whole held-out set on every replica (not this replica's "
                "shard), and every replica the same probe, policy and seed")

    def propose(self) -> int | None:
        """Probe where the policy says it is due; the new batch, or None to keep the current one."""
        if not self.batch_policy.due(sum(self.batches), self.batch, self.max_batch):
            return None
        if self.branches is None:
            raise InvalidState("a probe is due but no training is attached to branch from: call "
                               "controller.attach(branches) (PyTorch: aikit.elastic.Torch.TorchBranches(...)) before "
                               "training")
        new = self.batch_policy.act(self.branches, self.batch, sum(self.batches), max_batch=self.max_batch,
                              runs=self._runs_one)
        if new is None:
            return None
        self.changes.append((len(self.batches), self.batch, new, new / self.batch))
        self.batch = new
        return new

    def change_reason(self) -> str:
        row = self.batch_policy.rows[-1]
        factor = self.changes[-1][3]
        return (f"the probe's critical batch {row['critical_batch']} ({'growth' if factor > 1 else 'shrink'} factor "
                f"x{factor:g}, LR rule "
                f"{row['rule']}, LR x{row['lr_scale']:.3g} the base's)")

    def _runs_one(self, batch: int) -> bool:
        return bool(self._runs(np.array([batch]))[0])

    def state_dict(self) -> dict:
        return {**super().state_dict(), "policy": self.batch_policy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or "policy" not in state:
            raise InvalidValue("not a ProbeController state (no 'policy'): it was saved by a run without a probe "
                               "policy; build the sampler as that run did")
        policy = copy.copy(self.batch_policy)  # loaded whole before anything here changes
        policy.load_state_dict(state["policy"])
        super().load_state_dict({key: value for key, value in state.items() if key != "policy"})
        self.batch_policy = policy
