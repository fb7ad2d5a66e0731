"""When to probe the critical batch and what to do with the answer: :class:`ProbePolicy`.

Start at the run's small batch; probe at samples geometric in the run (``first``, then ``spacing``
times further each time, ``spacing²`` once a probe found no larger batch: fewer probes once the
estimate stops moving); grow by the probe's integer factor at the next update boundary, with the
LR rule it chose (OLMo-core's batch-size scheduler grows by integer factors with √ LR rescaling;
here the probe measures which rule transfers). Every probe is a row of :attr:`rows`, with its
samples and CPU time: the run's cost of measuring.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from aikit.core.critical_batch.probe import RULE_FACTORS, Branches, CriticalBatchProbe, checked_rules
from aikit.core.errors import InvalidValue, ProbeUnresolved
from aikit.core.validate import checked_float, non_negative_int, positive_int

ROW_KEYS = ("samples", "batch", "critical_batch", "rule", "lr_scale", "probe_samples", "probe_seconds", "resolved")
_STATE_KEYS = {"next_at", "lr_scale", "rules", "rows"}


class ProbePolicy:
    """Probes at a few points of the run and grows the batch to what they measured.

    Args:
        probe: the :class:`CriticalBatchProbe` to run.
        first: samples of the run before the first probe.
        spacing: each later probe comes ``spacing`` times further into the run (``spacing²``
            after a probe that found no larger batch).
        budget: the run's samples, where known (a probe whose window outruns it is refused).
        seed: the probes' sample draws (probe ``i`` draws with ``seed + i``).
    """

    def __init__(self, probe: CriticalBatchProbe, *, first: int, spacing: float = 2.0, budget: int | None = None,
                 seed: int = 0) -> None:
        if not isinstance(probe, CriticalBatchProbe):
            raise InvalidValue(f"ProbePolicy needs a CriticalBatchProbe, got {probe!r:.60}")
        self.probe = probe
        self.first = positive_int(first, "first")
        self.spacing = checked_float(spacing, "spacing", "a factor above 1", lambda s: 1 < s < math.inf)
        self.budget = None if budget is None else positive_int(budget, "budget")
        self.seed = non_negative_int(seed, "seed")
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

    def due(self, samples: int, batch: int, max_batch: int) -> bool:
        """Whether a probe is due after ``samples`` samples of the run at ``batch``."""
        return samples >= self.next_at and 2 * batch <= max_batch

    def act(self, branches: Branches, batch: int, samples: int, *, max_batch: int,
            runs: Callable[[int], bool] = lambda b: True) -> int | None:
        """Probe from ``branches``' state after ``samples`` samples at ``batch``; the batch to grow
        to (an integer multiple of ``batch``), or None to keep it."""
        left = None if self.budget is None else self.budget - samples
        try:
            result = self.probe.run(branches, batch, max_batch=max_batch, dataset_size=branches.dataset_size, runs=runs,
                                    samples_left=left, seed=self.seed + len(self.rows), rules=self.rules)
        except ProbeUnresolved as unresolved:
            if not any(row["resolved"] for row in self.rows):
                raise  # no probe was ever resolved: the held-out set is too small for this run
            self._record(samples, batch, batch, None, unresolved.samples, unresolved.seconds, resolved=False)
            self.next_at = samples * self.spacing ** 2
            return None
        grew = result.factor > 1
        if grew:
            self.lr_scale *= RULE_FACTORS[result.rule](result.factor)
            self.rules = (result.rule,)
        self._record(samples, batch, result.critical_batch, result.rule, result.samples, result.seconds, resolved=True)
        self.next_at = samples * (self.spacing if grew else self.spacing ** 2)
        return result.critical_batch if grew else None

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
