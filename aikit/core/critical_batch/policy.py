"""When to probe the critical batch and what to do with the answer: :class:`ProbePolicy`.

Start at the run's small batch; probe at samples geometric in the run (``first``, in samples or
as a fraction of the run's: after the loss's early fast drop, where a short window misleads;
then ``spacing`` times further each time, ``spacing²`` once a probe found no other batch: fewer
probes once the estimate stops moving); grow by the probe's integer factor at the next update
boundary, with the LR rule it chose (OLMo-core's batch-size scheduler grows by integer factors with
√ LR rescaling; here the probe measures which rule transfers). With ``shrink``, a probe after a
growth branches from the batch before it (at that batch's LR), so it can find that the grown batch
no longer recovers and move back down by the same factor (the LR by the rule's inverse): an early
probe's growth is not a commitment. Every probe is a row of :attr:`rows`, with its samples and CPU
time: the run's cost of measuring.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from aikit.core.critical_batch.probe import RULE_FACTORS, Branches, CriticalBatchProbe, checked_rules
from aikit.core.errors import InvalidValue, ProbeUnresolved
from aikit.core.validate import checked_bool, checked_float, non_negative_int, positive_int

ROW_KEYS = ("samples", "batch", "critical_batch", "rule", "lr_scale", "probe_samples", "probe_seconds", "resolved")
_STATE_KEYS = {"next_at", "lr_scale", "rules", "rows"}


class ProbePolicy:
    """Probes at a few points of the run and moves the batch to what they measured.

    Args:
        probe: the :class:`CriticalBatchProbe` to run.
        first: samples of the run before the first probe, or a fraction of ``budget`` (a float
            in (0, 1)).
        spacing: each later probe comes ``spacing`` times further into the run (``spacing²``
            after a probe that found no other batch).
        budget: the run's samples, where known (a probe whose window outruns it is refused).
        seed: the probes' sample draws (probe ``i`` draws with ``seed + i``).
        shrink: a probe after a growth branches from the batch before it, and may move back down.
    """

    def __init__(self, probe: CriticalBatchProbe, *, first: int | float, spacing: float = 2.0,
                 budget: int | None = None, seed: int = 0, shrink: bool = False) -> None:
        if not isinstance(probe, CriticalBatchProbe):
            raise InvalidValue(f"ProbePolicy needs a CriticalBatchProbe, got {probe!r:.60}")
        self.probe = probe
        self.spacing = checked_float(spacing, "spacing", "a factor above 1", lambda s: 1 < s < math.inf)
        self.budget = None if budget is None else positive_int(budget, "budget")
        self.first = self._first(first)
        self.seed = non_negative_int(seed, "seed")
        self.shrink = checked_bool(shrink, "shrink")
        self.next_at = self.first  # samples of the run at which the next probe is due
        self.lr_scale = 1.0  # the run's LR over the LR tuned at its first batch: the product of the rules' factors
        self.rules = probe.rules  # narrowed to the rule that recovered, once one has
        self.rows: list[dict] = []  # one per probe (ROW_KEYS)

    @property
    def probe_samples(self) -> int:
        """Samples all probes so far trained in their branches (not the run's: counted beside it)."""
        return sum(row["probe_samples"] for row in self.rows)

    @property
    def probe_seconds(self) -> float:
        """CPU seconds all probes so far took."""
        return sum(row["probe_seconds"] for row in self.rows)

    def _first(self, first: int | float) -> int:
        if isinstance(first, float) and 0 < first < 1:
            if self.budget is None:
                raise InvalidValue(f"first={first} is a fraction of the run's samples, but no budget was given: give "
                                   "ProbePolicy(..., budget=<the run's samples>), or first in samples")
            return max(1, int(first * self.budget))
        return positive_int(first, "first (samples, or a float in (0, 1): a fraction of the budget)")

    def due(self, samples: int, batch: int, max_batch: int) -> bool:
        """Whether a probe is due after ``samples`` samples of the run at ``batch``."""
        return samples >= self.next_at and (2 * batch <= max_batch or self.down_factor(batch) > 1)

    def down_factor(self, batch: int) -> int:
        """With ``shrink``: the factor a probe at ``batch`` looks down by (the run's last growth,
        within the batch it started at); 1 without, or before a growth."""
        grown = [row["critical_batch"] // row["batch"] for row in self.rows if row["critical_batch"] > row["batch"]]
        if not self.shrink or not grown:
            return 1
        return min(grown[-1], batch // self.rows[0]["batch"])

    def act(self, branches: Branches, batch: int, samples: int, *, max_batch: int,
            runs: Callable[[int], bool] = lambda b: True) -> int | None:
        """Probe from ``branches``' state after ``samples`` samples at ``batch``; the batch to move
        to (an integer multiple of ``batch``, or with ``shrink`` a divisor), or None to keep it."""
        left = None if self.budget is None else self.budget - samples
        down = self.down_factor(batch)
        if down > 1 and (batch % down or down not in self.probe.factors(batch // down, max_batch, runs)):
            down = 1  # the batches below do not split over the world (or the window): look up only
        if down == 1 and 2 * batch > max_batch:
            self.next_at = samples * self.spacing ** 2  # nothing to probe at max_batch
            return None
        base = batch // down  # the base branch trains there, at its LR (the rule's inverse factor)
        at = branches if down == 1 else _AtLR(branches, 1 / RULE_FACTORS[self.rules[0]](down))
        try:
            result = self.probe.run(at, base, max_batch=max_batch, dataset_size=branches.dataset_size, runs=runs,
                                    samples_left=left, seed=self.seed + len(self.rows), rules=self.rules)
        except ProbeUnresolved as unresolved:
            if not any(row["resolved"] for row in self.rows):
                raise  # no probe was ever resolved: the held-out set is too small for this run
            self._record(samples, batch, batch, None, unresolved.samples, unresolved.seconds, resolved=False)
            self.next_at = samples * self.spacing ** 2
            return None
        moved = result.critical_batch != batch
        if moved:
            rule = result.rule or self.rules[0]  # back to the base: the one rule the run grew with
            self.lr_scale *= RULE_FACTORS[rule](result.factor) / RULE_FACTORS[rule](down)
            self.rules = (rule,)
        self._record(samples, batch, result.critical_batch, result.rule, result.samples, result.seconds, resolved=True)
        self.next_at = samples * (self.spacing if moved else self.spacing ** 2)
        return result.critical_batch if moved else None

    def _record(self, samples: int, batch: int, critical: int, rule: str | None, spent: int, seconds: float,
                resolved: bool) -> None:
        values = (samples, batch, critical, rule, self.lr_scale, spent, seconds, resolved)
        self.rows.append(dict(zip(ROW_KEYS, values, strict=True)))

    def state_dict(self) -> dict:
        return {"next_at": self.next_at, "lr_scale": self.lr_scale, "rules": list(self.rules),
                "rows": [dict(row) for row in self.rows]}

    def load_state_dict(self, state: dict) -> None:
        """Load a :meth:`state_dict`, checked whole first (a refused state changes nothing)."""
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise InvalidValue(f"not a ProbePolicy state: keys {keys}, expected {sorted(_STATE_KEYS)}")
        next_at = checked_float(state["next_at"], "next_at", "a sample count", lambda v: 0 < v < math.inf)
        lr_scale = checked_float(state["lr_scale"], "lr_scale", "a positive factor", lambda v: 0 < v < math.inf)
        rules = checked_rules(state["rules"])
        rows = [dict(row) for row in state["rows"]]
        if any(set(row) != set(ROW_KEYS) for row in rows):
            raise InvalidValue(f"a ProbePolicy state's rows must each have the keys {list(ROW_KEYS)}")
        self.next_at, self.lr_scale, self.rules, self.rows = next_at, lr_scale, rules, rows


class _AtLR:
    """The run's branches, every branch's LR times ``factor``: a probe whose base is below the run's batch."""

    def __init__(self, branches: Branches, factor: float) -> None:
        self.branches, self.factor, self.dataset_size = branches, factor, branches.dataset_size

    def snapshot(self) -> object | None:
        return self.branches.snapshot()

    def restore(self, snapshot: object) -> None:
        self.branches.restore(snapshot)

    def train(self, indices: np.ndarray, batch: int, lr_factor: float) -> None:
        self.branches.train(indices, batch, lr_factor * self.factor)

    def evaluate(self) -> np.ndarray:
        return self.branches.evaluate()
