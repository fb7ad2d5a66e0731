"""The per-device batches a global batch can run at, largest first, and the search for the largest that fits.

When memory decides the per-device batch, the global batch stays and its split changes: every
candidate is the device batch of a plan of the same global batch (:func:`aikit.core.plan.make_plan`),
one per number of GA steps that makes a different plan (:func:`device_batches`), so the next
candidate down is the next plan with more GA steps, ragged where the policy allows. Accelerate's
``find_executable_batch_size`` multiplies the batch by 0.9 instead, and its example recomputes GA as
``observed // batch`` (128 -> 115 gives one GA step: a global batch of 115).

:func:`largest_fitting` finds the largest candidate that fits with few tries, given a function
that tries one (the adapter's: the user's step at that size, an out-of-memory error caught):
index 0, 1, 3, 7, ... of the candidates (the GA steps about doubling) until one fits, then a
bisection between it and the last that did not. Memory grows with the micro-batch, so a size
that fits has every smaller one fit. Framework-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.plan import Plan, divisors_of, make_plan, nearest_even_batches
from aikit.core.validate import positive_int

MAX_CANDIDATES = 100_000  # distinct plans of one global batch: about 2 sqrt(G / devices) for policy "ragged"


def smaller_plan(plan: Plan) -> Plan | None:
    """The plan of the same global batch, devices and policy with the next smaller device batch
    (more GA steps); None when the device batch is 1 already."""
    g, n, policy = plan.global_batch_size, plan.available_gpus, plan.policy
    if plan.device_batch == 1:
        return None
    if policy == "error":  # the even splits: G = devices x micro_steps x batch
        devices = plan.num_replicas
        micro_steps = next((d // devices for d in divisors_of(g) if d % devices == 0 and g // d < plan.device_batch),
                           None)
        if micro_steps is None:
            return None
        return make_plan(g, g // (devices * micro_steps), n, policy=policy, rank=plan.rank)
    return make_plan(g, plan.device_batch - 1, n, policy=policy, rank=plan.rank)


def device_batches(global_batch_size: int, devices: int, policy: str = "ragged",
                   candidates: Iterable[int] | None = None, start: int | None = None) -> list[int]:
    """The per-device batches to try for ``global_batch_size`` on ``devices``, largest first, each
    the device batch of a different plan: every plan's (from one GA step on, or from ``start``),
    or those of ``candidates`` (each a ``max_device_batch``), refused where one cannot make the
    global batch under ``policy``, with the nearest that can."""
    g, n = positive_int(global_batch_size, "global_batch_size"), positive_int(devices, "devices")
    if candidates is None:
        plan, found = make_plan(g, g if start is None else positive_int(start, "start"), n, policy=policy), []
        while plan is not None and len(found) < MAX_CANDIDATES:
            found.append(plan.device_batch)
            plan = smaller_plan(plan)
        return found
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise InvalidType(f"candidates must be a list of per-device batches (ints), got {candidates!r:.60}")
    sizes = [positive_int(c, f"candidates[{i}]") for i, c in enumerate(candidates)]
    if not sizes:
        raise InvalidValue("candidates is empty: give the per-device batches to try, e.g. [64, 32, 16], or leave it "
                           "out (every plan's device batch)")
    plans, refused = {}, []
    for size in sizes:
        try:
            plans[make_plan(g, size, n, policy=policy).device_batch] = size
        except InvalidValue:
            refused.append(size)
    if refused:
        below, above = nearest_even_batches(g, min(refused), n)
        fits = [str(b) for b in device_batches(g, n, policy)[:8]]
        raise InvalidValue(
            f"candidates {refused} cannot make global batch {g} on {n} device(s) with policy {policy!r} (an even "
            f"split of {g} needs a per-device batch that divides it: {', '.join(fits)}, ...): use those, or a global "
            f"batch near {g} such as {below} or {above}, or policy 'ragged'"
        )
    return sorted(plans, reverse=True)


@dataclass
class Search:
    """What a search for the largest per-device batch that fits tried: ``tries``, each
    ``(size, fitted, seconds)``, in order; ``found`` (None: not even the smallest fitted)."""

    tries: list[tuple[int, bool, float]] = field(default_factory=list)
    found: int | None = None

    @property
    def seconds(self) -> float:
        """The search's cost: the time its tries took."""
        return sum(seconds for _, _, seconds in self.tries)

    def summary(self) -> str:
        tried = ", ".join(f"{size} {'fits' if fitted else 'out of memory'}" for size, fitted, _ in self.tries)
        return f"{len(self.tries)} tries in {self.seconds:.2f} s ({tried})"


def largest_fitting(sizes: list[int], fits: Callable[[int], bool], clock: Callable[[], float] = time.perf_counter
                    ) -> Search:
    """The largest of ``sizes`` (descending) for which ``fits(size)`` is True: tries indices 0, 1,
    3, 7, ... until one fits, then bisects between it and the last that did not."""
    search, fitted, failed = Search(), {}, -1  # fitted: index -> bool; failed: the largest index known to fail

    def attempt(index: int) -> bool:
        began = clock()
        ok = bool(fits(sizes[index]))
        search.tries.append((sizes[index], ok, clock() - began))
        fitted[index] = ok
        return ok

    index = 0
    while not attempt(index):
        failed = index
        if index == len(sizes) - 1:
            return search
        index = min(2 * index + 1, len(sizes) - 1)
    while index - failed > 1:  # sizes[index] fits, sizes[failed] does not (or failed is -1)
        middle = (index + failed) // 2
        if attempt(middle):
            index = middle
        else:
            failed = middle
    search.found = sizes[index]
    return search


def agreed(found: Iterable[int | None]) -> int | None:
    """The per-device batch every replica runs: the smallest any replica found (None: one found none)."""
    found = list(found)
    return None if any(f is None for f in found) else min(found)


def steps_note(plan: Plan) -> str:
    """``8 GA steps of 32 per device`` (ragged: ``of 43 or 42``), for a log line."""
    low = plan.global_batch_size // (plan.num_replicas * plan.micro_steps)
    sizes = f"{plan.device_batch}" if plan.is_even else f"{plan.device_batch} or {low}"
    return f"{plan.micro_steps} GA step{'s' if plan.micro_steps != 1 else ''} of {sizes} per device"
