"""What a trace optimizer saves and loads: its position in the trace, the wrapped optimizer's
state and, in the middle of a step, the gradients accumulated so far (so a resume continues to
the same bits). A state is checked whole before anything changes, and loading runs no collective.

:class:`TraceState` is a base of :class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`; a
subclass that keeps more (AdaScale's trackers, an adaptive run's schedule) names its keys in
``_extra_keys`` and saves, checks and loads them in ``_extra_state``, ``check_state`` and
``_load_extra``. The format is the one aikit has always written: states saved before still load.
"""

from __future__ import annotations

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_int
from aikit.runtime.Torch.state_checks import check_groups, check_pending

_TRACE_KEYS = {"epoch", "step", "micro", "updates", "rank", "accumulated", "terms"}
_TRACE_KEYS_BEFORE_TERMS = _TRACE_KEYS - {"terms"}  # states saved before accumulate(weight=) existed
_INTACT = "restore an intact commit (was it edited?)"


class TraceState:
    """``state_dict``, ``load_state_dict`` and ``check_state`` of a trace optimizer."""

    _extra_keys: tuple[str, ...] = ()  # state_dict() keys a subclass adds

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, the position in the trace, and any gradients
        accumulated in a step not yet finished (so a resume continues to the same bits)."""

        def build() -> dict:
            accumulated = [None if p.grad is None else p.grad.detach().clone() for p in self.params] \
                if self.micro else None
            return {"optimizer": self.optimizer.state_dict(),
                    "trace": {"epoch": self.epoch, "step": self.step_index, "micro": self.micro,
                              "updates": self.updates, "rank": self.sampler.rank, "accumulated": accumulated,
                              "terms": [int(self.engine.terms), self._declared] if self._declared else None},
                    **self._extra_state()}

        return self._run_state_dict_hooks(build)

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state`` and put the sampler where it stood: the next ``set_epoch`` of that
        epoch (on both) continues mid-epoch. Mid-step states carry their rank's gradients.
        Local: checked whole before anything changes, no collective (the steps this replica sits
        out at the resumed position are joined by the next ``set_epoch`` or ``join``)."""
        self._run_load_hooks(state, self._load)

    def _load(self, state: dict) -> None:
        self.check_state(state)
        trace = state["trace"]
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = trace["updates"]
        if trace["accumulated"] is not None:
            for p, grad in zip(self.params, trace["accumulated"], strict=True):
                p.grad = None if grad is None else grad.to(p.device).clone()
        self._load_extra(state)
        self.sampler.resume(trace["epoch"], trace["step"], trace["micro"])
        self._start(trace["epoch"], trace["step"], trace["micro"])
        self.engine.terms, self._declared = trace.get("terms") or (0, 0)
        self.updated = False

    def _extra_state(self) -> dict:
        return {}

    def _load_extra(self, state: dict) -> None:
        """Load what ``_extra_state`` saved (``state`` already checked)."""

    def check_state(self, state: dict) -> None:
        """Every reason ``state`` cannot be loaded here, before anything is changed."""
        expected = {"optimizer", "trace", *self._extra_keys}
        if not isinstance(state, dict) or set(state) != expected:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise InvalidValue(f"not a {type(self).__name__} state: keys {keys}, expected "
                             f"{sorted(expected)} (load the wrapped optimizer's own state into it directly)")
        trace = state["trace"]
        if not isinstance(trace, dict) or set(trace) not in (_TRACE_KEYS, _TRACE_KEYS_BEFORE_TERMS):
            raise InvalidValue(f"{type(self).__name__} state['trace'] needs keys {sorted(_TRACE_KEYS)}")
        for key in ("epoch", "step", "micro", "updates", "rank"):  # what this optimizer writes (was it edited?)
            checked_int(trace[key], f"the checkpoint's trace {key}", 0, None, "a non-negative integer", _INTACT)
        if trace["micro"] and trace["rank"] != self.sampler.rank:
            raise InvalidValue(f"this state was saved by rank {trace['rank']} in the middle of a step; "
                             f"rank {self.sampler.rank} must load its own")
        check_groups(self.optimizer, state["optimizer"])
        if trace["accumulated"] is not None:
            check_pending(self.params, trace["accumulated"])
        self._check_position(state)

    def _check_position(self, state: dict) -> None:
        """Refuse a saved position the sampler has not (``state`` otherwise checked)."""
        trace = state["trace"]
        self.sampler.check_position(trace["epoch"], trace["step"], trace["micro"], "the checkpoint's trace ", _INTACT)
