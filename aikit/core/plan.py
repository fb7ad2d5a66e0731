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

import math
import operator
from dataclasses import dataclass

from aikit.core.ga import sample_weight

POLICIES = ("ragged", "fewer_devices", "error")


def positive_int(value: object, name: str) -> int:
    """Return ``value`` as an int, or raise a ValueError naming it (bools and floats refused)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if number <= 0:
        raise ValueError(f"{name} must be a positive integer, got {number}")
    return number


@dataclass(frozen=True)
class Plan:
    """How one update of ``global_batch_size`` samples runs on the available devices.

    ``micro_batch_sizes[s][d]`` is the number of samples device ``d`` processes in GA step
    ``s``; a 0 means the device sits that step out and contributes zero weight.
    """

    global_batch_size: int
    max_gpu_batch_size: int
    available_gpus: int
    micro_batch_sizes: tuple[tuple[int, ...], ...]
    policy: str = "ragged"
    rank: int = 0

    @property
    def steps(self) -> int:
        """GA steps per update (1 when no accumulation is needed)."""
        return len(self.micro_batch_sizes)

    @property
    def gpus(self) -> int:
        """Devices that take part in training."""
        return len(self.micro_batch_sizes[0])

    @property
    def batch_size(self) -> int:
        """The per-device batch to give a data loader: the largest micro-batch."""
        return max(max(step) for step in self.micro_batch_sizes)

    @property
    def master(self) -> bool:
        """True on the process of global rank 0 only."""
        return self.rank == 0

    @property
    def is_even(self) -> bool:
        """True when every micro-batch has the same size (static shapes)."""
        return len({size for step in self.micro_batch_sizes for size in step}) == 1

    @property
    def step_batch_sizes(self) -> tuple[int, ...]:
        """Samples per GA step over all devices: the batch a DataParallel loader yields."""
        return tuple(sum(step) for step in self.micro_batch_sizes)

    def device_batch_sizes(self, device: int) -> tuple[int, ...]:
        """The micro-batch sizes one device processes, step by step."""
        return tuple(step[device] for step in self.micro_batch_sizes)

    def weight(self, step: int, device: int) -> float:
        """Share of the update's gradient owed to one micro-batch (its samples / G)."""
        return sample_weight(self.micro_batch_sizes[step][device], self.global_batch_size)

    def summary(self) -> str:
        """A few readable lines: what runs where, and why."""
        lines = [
            f"aikit elastic plan: global batch {self.global_batch_size}, at most {self.max_gpu_batch_size} per device",
            f"  devices: {self.gpus} used of {self.available_gpus} available",
            f"  GA steps per update: {self.steps}",
        ]
        if self.is_even:
            lines.append(f"  micro-batch: {self.batch_size} on every device in every step")
        else:
            lines.append(
                f"  micro-batches (policy {self.policy!r}, exact sample weights): "
                + "; ".join(f"step {s}: {list(sizes)}" for s, sizes in enumerate(self.micro_batch_sizes))
            )
        lines.append(f"  master: {self.master} (rank {self.rank})")
        return "\n".join(lines)


def even_split(global_batch_size: int, max_gpu_batch_size: int, gpus: int) -> int | None:
    """Fewest GA steps that give every device the same micro-batch, or None if none does."""
    if global_batch_size % gpus:
        return None
    per_device = global_batch_size // gpus
    for steps in range(math.ceil(per_device / max_gpu_batch_size), per_device + 1):
        if per_device % steps == 0:
            return steps
    return None


def nearest_even_batches(global_batch_size: int, max_gpu_batch_size: int, gpus: int) -> tuple[int, int]:
    """The closest global batches below and above G that split evenly over ``gpus`` devices."""
    steps = math.ceil(global_batch_size / (gpus * max_gpu_batch_size))
    below = (global_batch_size // (gpus * steps)) * gpus * steps
    above = math.ceil(global_batch_size / (gpus * steps)) * gpus * steps
    return below, above


def make_plan(
    global_batch_size: int,
    max_gpu_batch_size: int,
    gpus: int = 1,
    *,
    policy: str = "ragged",
    rank: int = 0,
) -> Plan:
    """Plan GA steps and micro-batches for ``gpus`` devices; see the module docstring."""
    g = positive_int(global_batch_size, "global_batch_size")
    m = positive_int(max_gpu_batch_size, "max_gpu_batch_size")
    n = positive_int(gpus, "gpus")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if isinstance(rank, bool) or operator.index(rank) < 0:
        raise ValueError(f"rank must be a non-negative integer, got {rank!r}")

    if policy == "fewer_devices":
        options = [(even_split(g, m, d), -d) for d in range(1, n + 1)]
        steps, minus_devices = min(o for o in options if o[0] is not None)
        devices = -minus_devices
        sizes = ((g // (devices * steps),) * devices,) * steps
        return Plan(g, m, n, sizes, policy, rank)

    devices = min(n, g)  # a device that could never get a sample is not used
    steps = math.ceil(g / (devices * m))
    base, extra = divmod(g, devices * steps)
    if extra and policy == "error":
        below, above = nearest_even_batches(g, m, devices)
        raise ValueError(
            f"global_batch_size {g} does not split evenly over {devices} devices with at most "
            f"{m} samples each: use global_batch_size {below} or {above}, or policy "
            f"'fewer_devices' (an even split on fewer devices) or, in PyTorch, 'ragged' (exact weighted micro-batches)"
        )
    sizes = tuple(tuple(base + (s * devices + d < extra) for d in range(devices)) for s in range(steps))
    return Plan(g, m, n, sizes, policy, rank)


def plan_table(
    global_batch_size: int, max_gpu_batch_size: int, gpu_counts: list[int], policy: str = "ragged"
) -> list[Plan]:
    """Plans for several device counts: seed 002's table."""
    return [make_plan(global_batch_size, max_gpu_batch_size, n, policy=policy) for n in gpu_counts]
