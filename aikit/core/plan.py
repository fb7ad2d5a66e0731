"""Elastic plan: split a global batch over devices and gradient-accumulation (GA) steps.

Given a global batch ``G``, the largest batch one device can hold ``M`` and ``N`` devices, a
plan says how many GA steps run before each update and how many samples every device
processes in every step. Two rules hold for every plan (the Run:AI original broke both):

* no device ever gets more than ``M`` samples in one micro-batch, and
* the samples of one update add up to exactly ``G``.

When ``G`` does not split evenly over ``N`` devices and ``k`` steps, a *policy* decides:

``"ragged"`` (default)
    Use every device and the fewest GA steps; micro-batches differ by at most one sample
    (the larger ones come first) and every micro-batch's gradient is weighted by its share of
    ``G``, so the update is exactly the big-batch update. Chosen as the default because it
    keeps all hardware busy at the smallest number of sequential steps and changes nothing
    the user asked for.
``"fewer_devices"``
    Use the device count (at most ``N``) that splits ``G`` evenly with the fewest GA steps,
    preferring more devices on a tie. Every micro-batch has the same shape (XLA/TPU friendly).
``"error"``
    Refuse an uneven split with a ValueError that names the nearest global batches that do
    split evenly.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.ga import sample_share
from aikit.core.validate import checked_int, index_in, positive_int

POLICIES = ("ragged", "fewer_devices", "error")


@dataclass(frozen=True)
class Plan:
    """How one update of ``global_batch_size`` samples runs on the available devices.

    ``num_replicas`` devices each run ``micro_steps`` micro-steps per update (Run:AI's "GA
    steps", which its table names ``steps``: kept as a read-only property, as its ``gpus`` is for
    ``num_replicas``; aikit's *step* is an update). Device ``d``'s micro-batch in micro-step ``s``
    (``size(s, d)``) has ``G // (num_replicas * micro_steps)`` samples, one more for the first
    ``G % (num_replicas * micro_steps)`` of them in micro-step order: a plan is a few numbers,
    whatever ``G``.

    Run:AI's AIkit Elastic's table names the bound ``max_gpu_batch_size``, the per-device batch
    ``batch_size``, the micro-steps ``steps`` and the devices ``gpus``: all are kept as
    properties, beside aikit's :attr:`max_device_batch`, :attr:`device_batch`,
    :attr:`micro_steps` and :attr:`num_replicas`.
    """

    global_batch_size: int
    max_device_batch: int  # the most samples one device holds in a micro-batch
    available_gpus: int
    num_replicas: int  # devices (replicas) that take part in training
    micro_steps: int  # micro-steps (GA steps) per update (1 when no accumulation is needed)
    policy: str = "ragged"
    rank: int = 0

    @property
    def gpus(self) -> int:
        """:attr:`num_replicas` by Run:AI's AIkit Elastic's name (published by ``init``)."""
        return self.num_replicas

    @property
    def steps(self) -> int:
        """:attr:`micro_steps` by Run:AI's AIkit Elastic's name (its "GA steps", published by ``init``)."""
        return self.micro_steps

    @property
    def max_gpu_batch_size(self) -> int:
        """:attr:`max_device_batch` by Run:AI's AIkit Elastic's name."""
        return self.max_device_batch

    @property
    def _split(self) -> tuple[int, int]:
        return divmod(self.global_batch_size, self.num_replicas * self.micro_steps)

    def size(self, micro_step: int, device: int) -> int:
        """Samples device ``device`` processes in ``micro_step`` (0: it sits the micro-step out)."""
        base, extra = self._split
        return base + (micro_step * self.num_replicas + device < extra)

    @property
    def micro_batch_sizes(self) -> tuple[tuple[int, ...], ...]:
        """``[s][d]``: every micro-batch size, spelled out (``micro_steps x num_replicas`` numbers)."""
        return tuple(tuple(self.size(s, d) for d in range(self.num_replicas)) for s in range(self.micro_steps))

    @property
    def device_batch(self) -> int:
        """The per-device batch to give a data loader: the largest micro-batch."""
        base, extra = self._split
        return base + (extra > 0)

    @property
    def batch_size(self) -> int:
        """:attr:`device_batch` by Run:AI's AIkit Elastic's name (published by ``init``)."""
        return self.device_batch

    @property
    def samples_per_update(self) -> int:
        """Samples over all micro-batches of one update (``global_batch_size``, by construction)."""
        base, extra = self._split
        return base * self.num_replicas * self.micro_steps + extra

    @property
    def master(self) -> bool:
        """True on the process of global rank 0 only."""
        return self.rank == 0

    @property
    def is_even(self) -> bool:
        """True when every micro-batch has the same size (static shapes)."""
        return self._split[1] == 0

    @property
    def step_batch_sizes(self) -> tuple[int, ...]:
        """Samples per micro-step over all devices: the batch a DataParallel loader yields."""
        return tuple(sum(step) for step in self.micro_batch_sizes)

    def device_batch_sizes(self, device: int) -> tuple[int, ...]:
        """The micro-batch sizes one device processes, micro-step by micro-step."""
        return tuple(self.size(s, device) for s in range(self.micro_steps))

    def share(self, micro_step: int, device: int) -> float:
        """The share of the update's gradient owed to one micro-batch (its samples / G)."""
        return sample_share(self.size(micro_step, device), self.global_batch_size)

    def summary(self) -> str:
        """A few readable lines: what runs where, and why."""
        lines = [
            f"aikit elastic plan: global batch {self.global_batch_size}, at most {self.max_device_batch} per device",
            f"  devices: {self.num_replicas} used of {self.available_gpus} available",
            f"  GA steps per update: {self.micro_steps}",
        ]
        base, extra = self._split
        if self.is_even:
            lines.append(f"  micro-batch: {self.device_batch} on every device in every step")
        elif self.micro_steps * self.num_replicas <= 64:
            lines.append(
                f"  micro-batches (policy {self.policy!r}, exact sample weights): "
                + "; ".join(f"step {s}: {list(sizes)}" for s, sizes in enumerate(self.micro_batch_sizes))
            )
        else:
            lines.append(f"  micro-batches (policy {self.policy!r}, exact sample weights): the first {extra} "
                         f"(in step order) of {base + 1}, the other "
                         f"{self.micro_steps * self.num_replicas - extra} of {base}")
        lines.append(f"  master: {self.master} (rank {self.rank})")
        return "\n".join(lines)


def unweighted_problem(plan: Plan | None, micro_steps: int, global_batch_size: int | None) -> str | None:
    """Why an update of ``micro_steps`` micro-steps weighed equally (each ``1 / micro_steps``:
    none declared its samples) is not an update of ``plan``, the published plan a GA wrapper of
    ``global_batch_size`` (None: the plan's) follows with as many micro-steps; None where it is, or
    where the wrapper follows another plan. A ragged plan's micro-batches differ, so no equal
    weights are its: a loader of its ``device_batch`` feeds more samples than the global batch
    (issue 47: ``init(256, "auto")`` found 86, and the basic loop trained 258 per update)."""
    if plan is None or plan.is_even or micro_steps != plan.micro_steps or global_batch_size not in (
            None, plan.global_batch_size):
        return None
    shown = [str(step[0]) if plan.num_replicas == 1 else str(list(step)) for step in plan.micro_batch_sizes[:4]]
    sizes = ", ".join(shown) + (", ..." if plan.micro_steps > 4 else "")
    fed = plan.device_batch * plan.num_replicas
    return (f"the plan of aikit.elastic.Torch.init is ragged (global batch {plan.global_batch_size} as {sizes} per GA "
            f"step{'' if plan.num_replicas == 1 else ' and device'}), but this update's {micro_steps} micro-steps "
            "declared no "
            f"samples, so each weighs 1/{micro_steps}: not the plan's update (a loader of batch_size {fed} trains "
            f"{fed * plan.micro_steps} samples per update). Feed each window of {plan.global_batch_size} samples as "
            "micro_batch_slices(plan), each piece inside optimizer.accumulate(model, samples=len(x)); or plan an "
            "even split (policy='fewer_devices'); a wrapper that follows no plan takes its own global_batch_size=")


def micro_batch_slices(plan: Plan, device: int | None = None) -> list[slice]:
    """One slice per GA step into a window of ``plan.global_batch_size`` samples: the samples
    ``device`` processes in that step, or with ``device=None`` the whole step over all devices
    (the batch a DataParallel loader yields). A device sitting a step out gets an empty slice.

    An update consumes ``G`` consecutive samples (a *window* of a shuffled epoch), laid out step
    by step and, inside a step, device by device: a GA step over all devices is one contiguous
    chunk, what a single-process ``torch.nn.DataParallel`` loader yields and scatters. Every rank
    of a multi-process run slices the same window (same seed) and takes its own pieces, so no
    sample is lost or repeated."""
    if device is not None:
        last = plan.num_replicas - 1
        device = checked_int(device, "device", 0, last, f"an integer in [0, {last}] for this plan")
    starts = list(accumulate((size for step in plan.micro_batch_sizes for size in step), initial=0))
    n = plan.num_replicas
    if device is None:
        return [slice(starts[s * n], starts[(s + 1) * n]) for s in range(plan.micro_steps)]
    return [slice(starts[s * n + device], starts[s * n + device + 1]) for s in range(plan.micro_steps)]


def nearest_even_batches(global_batch_size: int, max_device_batch: int, num_replicas: int) -> tuple[int, int]:
    """The closest global batches below and above G that split evenly over ``num_replicas`` devices."""
    n = num_replicas
    micro_steps = math.ceil(global_batch_size / (n * max_device_batch))
    below = (global_batch_size // (n * micro_steps)) * n * micro_steps
    above = math.ceil(global_batch_size / (n * micro_steps)) * n * micro_steps
    return below, above


def devices_here(gpus: object, available: int, where: str, global_batch_size: int, max_device_batch: int) -> int:
    """The devices ``init`` plans for: ``gpus`` (None: all ``available``), at most the ``available``
    devices found ``where``. ``init`` plans the machine it runs on; a plan for more devices than
    it has is one for another machine, which :func:`make_plan` and ``aikit plan --gpus`` make."""
    if gpus is None:
        return available
    gpus = positive_int(gpus, "gpus")
    if gpus > available:
        g, m = global_batch_size, max_device_batch
        raise InvalidValue(
            f"gpus={gpus} but only {available} device(s) can be used here ({where}): pass gpus={available} or fewer, "
            f"or leave gpus out; init plans the machine it runs on, so for a machine with {gpus} devices run "
            f"`aikit plan --global-batch-size {g} --max-device-batch {m} --gpus {gpus}` or call "
            f"aikit.core.plan.make_plan({g}, {m}, {gpus})"
        )
    return gpus


def make_plan(global_batch_size: int, max_device_batch: int, gpus: int = 1, *, policy: str = "ragged",
              rank: int = 0) -> Plan:
    """Plan GA steps and micro-batches for ``gpus`` devices; see the module docstring.
    ``max_device_batch`` is the most samples one device holds. Any ``gpus`` plans: for a machine
    you are not on too. Constant time and memory in ``G`` (``fewer_devices`` searches the divisors
    of ``G``)."""
    g = positive_int(global_batch_size, "global_batch_size")
    m = positive_int(max_device_batch, "max_device_batch")
    n = positive_int(gpus, "gpus")
    if policy not in POLICIES:
        raise InvalidValue(f"policy must be one of {POLICIES}, got {policy!r}")
    rank = index_in(rank, "rank", n)

    if policy == "fewer_devices":
        devices, micro_steps = fewest_micro_steps_even_split(g, m, n)
        return Plan(g, m, n, devices, micro_steps, policy, rank)

    devices = min(n, g)  # a device that could never get a sample is not used
    micro_steps = -(-g // (devices * m))
    if g % (devices * micro_steps) and policy == "error":
        below, above = nearest_even_batches(g, m, devices)
        raise InvalidValue(
            f"global_batch_size {g} does not split evenly over {devices} devices with at most "
            f"{m} samples each: use global_batch_size {below} or {above}, or policy "
            f"'fewer_devices' (an even split on fewer devices) or, in PyTorch, 'ragged' (exact weighted micro-batches)"
        )
    return Plan(g, m, n, devices, micro_steps, policy, rank)


def even_micro_batches(
    batch_sizes: np.ndarray, max_device_batch: int, devices: int, min_micro_batches: int | np.ndarray = 1
) -> np.ndarray:
    """The micro-batch of every global batch in ``batch_sizes`` when each is split evenly over
    ``devices`` with the fewest GA steps that keep a micro-batch at most ``max_device_batch`` and
    give at least ``min_micro_batches`` micro-batches over all devices (one per batch, or one for
    all; 2 on one device measures the gradient noise); 0 where no such even split exists.

    A function of the batch alone, so a trace of global batches and these numbers fix every
    micro-batch: how an adaptive run that grows its per-device batch (as AdaptDL does) is
    replayed by ``TraceSampler(max_device_batch=...)``."""
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    micro_steps = np.maximum(-(-min_micro_batches // devices), -(-sizes // (devices * max_device_batch)))
    return np.where(sizes % (devices * micro_steps) == 0, sizes // (devices * micro_steps), 0)


def largest_even_batch(limit: int, max_device_batch: int, devices: int, min_micro_batches: int = 1) -> int:
    """The largest batch of at most ``limit`` samples that :func:`even_micro_batches` splits (0 if
    none): what an epoch's last update takes of the samples left."""
    least = -(-min_micro_batches // devices)  # fewest GA micro_steps
    micro_steps = max(least, -(-limit // (devices * max_device_batch)))
    batch = limit // (devices * micro_steps) * devices * micro_steps
    if batch and (micro_steps == least or batch > devices * (micro_steps - 1) * max_device_batch):
        return batch  # the largest even split with this many micro-steps
    # one micro-step fewer, full micro-batches
    return devices * (micro_steps - 1) * max_device_batch if micro_steps > least else 0


def even_split_problems(batch_sizes: np.ndarray, max_device_batch: int, devices: int,
                        min_micro_batches: int | np.ndarray = 1) -> list[str]:
    """One line per batch of ``batch_sizes`` that :func:`even_micro_batches` cannot split, the
    first ten with the nearest batches that split (empty when all do)."""
    sizes = np.asarray(batch_sizes, dtype=np.int64)
    least = np.broadcast_to(np.asarray(min_micro_batches, dtype=np.int64), sizes.shape)
    problems = []
    for row in np.flatnonzero(even_micro_batches(sizes, max_device_batch, devices, least) == 0).tolist():
        size, min_micro_batches = int(sizes[row]), int(least[row])
        use = ""
        if len(problems) < 10:
            window = min(4 * devices * (size // (devices * max_device_batch) + min_micro_batches + 1), 10**6)
            near = np.arange(max(1, size - window), size + window + 1)
            fits = near[even_micro_batches(near, max_device_batch, devices, min_micro_batches) > 0]
            nearest = [str(int(b)) for b in (*fits[fits < size][-1:], *fits[fits > size][:1])]
            use = f"; use {' or '.join(nearest)}" if nearest else ""
        problems.append(
            f"row {row} (step {row}): batch size {size} does not split evenly over {devices} replica(s) in "
            f"micro-batches of at most max_device_batch {max_device_batch}"
            f"{f' ({min_micro_batches} or more in all)' if min_micro_batches > 1 else ''}{use}")
    return problems


def fewest_micro_steps_even_split(g: int, m: int, n: int) -> tuple[int, int]:
    """``(devices, micro_steps)``: an even split of ``g`` (``g = devices * micro_steps * b``, ``b <= m``,
    ``devices <= n``) with the fewest micro_steps, then the most devices. Both are divisors of ``g``,
    so the search runs over those: bounded by their count (at most 103,680 below 10**18)."""
    divisors = divisors_of(g)
    first = bisect.bisect_left(divisors, -(-g // (n * m)))  # fewer micro_steps cannot hold g
    for micro_steps in divisors[first:]:
        per_step = g // micro_steps
        fewest = -(-per_step // m)  # fewer devices would need micro-batches above m
        for devices in reversed(divisors[: bisect.bisect_right(divisors, min(n, per_step))]):
            if devices < fewest:
                break
            if per_step % devices == 0:
                return devices, micro_steps
    raise AssertionError("unreachable: micro_steps = g on one device always splits evenly")


# ---- divisors of a batch size (Miller-Rabin and Pollard's rho, bounded) ---------------------


def divisors_of(number: int) -> list[int]:
    """Every divisor of ``number``, ascending."""
    divisors = [1]
    for prime, power in _factorize(number).items():
        divisors = [d * prime**k for d in divisors for k in range(power + 1)]
    return sorted(divisors)


def _factorize(number: int) -> dict[int, int]:
    factors: dict[int, int] = {}
    for prime in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        while number % prime == 0:
            factors[prime] = factors.get(prime, 0) + 1
            number //= prime
    pending = [number] if number > 1 else []
    while pending:
        value = pending.pop()
        if _is_prime(value):
            factors[value] = factors.get(value, 0) + 1
        else:
            factor = _pollard_rho(value)
            pending += [factor, value // factor]
    return factors


def _is_prime(n: int) -> bool:
    """Miller-Rabin; these bases make it exact below 3.3 * 10**24."""
    if n < 2:
        return False
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        if a % n == 0:
            continue
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _pollard_rho(n: int, budget: int = 1 << 17) -> int:
    """A non-trivial factor of the composite ``n`` (Brent's variant), within ``budget`` steps."""
    rng = random.Random(n)
    spent = 0
    while spent < budget:
        y, c, batch = rng.randrange(1, n), rng.randrange(1, n), 128
        g = r = q = 1
        while g == 1 and spent < budget:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(batch, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g, k = math.gcd(q, n), k + batch
            spent, r = spent + r, r * 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if 1 < g < n:
            return g
    raise InvalidValue(
        f"policy 'fewer_devices' needs the divisors of the global batch, and a factor of it ({len(str(n))} digits) "
        "has prime factors too large to find quickly: use policy 'ragged' or a global batch with small prime factors"
    )
