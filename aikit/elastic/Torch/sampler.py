"""TraceSampler: a DataLoader ``batch_sampler`` that follows a batch-size trace.

Every global step of the trace is cut into full micro-batches of ``micro_batch`` samples
(one static shape, so XLA compiles once) and dealt to the replicas by
:class:`aikit.core.schedule.Schedule`; this sampler yields this replica's micro-batches, step
after step. A step that deals this replica nothing yields nothing: the trace optimizer still
takes part in that step's all-reduce (see :mod:`aikit.elastic.Torch.trace_optim`). eth-easl's
``CustomSampler`` (its argument order, ``minibatch_size``, ``get_epochtrace`` and the rest, its
printed lines) is this sampler under eth-easl's names, at the edge: :mod:`aikit.elastic.Torch.eth_easl`.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator, Sized
from functools import cached_property
from numbers import Integral
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.schedule import EpochSchedule, Permutation, Schedule, numpy_permutation, world_problem
from aikit.core.trace import Trace, load_trace
from aikit.core.validate import checked_bool, index_in
from aikit.runtime.Torch import distributed, spmd


def torch_permutation(seed: int, epoch: int, dataset_size: int) -> np.ndarray:
    """eth-easl's sample order: ``torch.randperm`` from a CPU generator seeded with ``seed + epoch``."""
    if seed + epoch >= 2**64:
        raise InvalidValue(f"permutation='torch' seeds torch's generator with seed + epoch, which must be below 2**64, "
                           f"got {seed} + {epoch}: use a smaller seed")
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(dataset_size, generator=generator).numpy()


PERMUTATIONS: dict[str, Permutation] = {"numpy": numpy_permutation, "torch": torch_permutation}


class TraceSampler(Sampler[list[int]]):
    """This replica's micro-batches of every step of a batch-size trace, as lists of indices.

    ``dataset`` is a Dataset (its ``len()`` is used) or an int; ``dataset_size=`` says the same
    thing. ``trace`` is a CSV path (``step,batchsize``), a list of sizes, an int (constant) or a
    :class:`~aikit.core.trace.Trace`; ``when_exhausted`` overrides its end-of-trace policy; a CSV
    whose step column restarts or skips is read in file order with a warning (``strict_steps=True``
    refuses it). ``num_replicas`` and ``rank`` default to the running engine (torch.distributed,
    Horovod or torch_xla). Every epoch is a fresh permutation seeded by ``seed`` and the epoch:
    NumPy's ``default_rng([seed, epoch])``, or with ``permutation="torch"`` eth-easl's
    ``torch.randperm`` seeded ``seed + epoch`` (same seed, same samples as the original), or a
    function ``(seed, epoch, dataset_size) -> order``. Under torch_xla's SPMD the process is one
    replica and each micro-batch holds ``micro_batch`` samples for every device of the mesh (see
    :mod:`aikit.runtime.Torch.spmd`).

    ``micro_batch`` (default 32) fixes every micro-batch; ``max_device_batch`` instead splits
    each step evenly over the replicas in the fewest micro-batches of at most that many samples,
    at least ``min_micro_batches`` of them in all, two on every ``noise_every``-th step
    (:func:`aikit.core.plan.even_micro_batches`): the per-device batch grows with the step, as in
    an :class:`~aikit.elastic.Torch.AdaptiveSampler` run with ``max_device_batch``, which this
    replays (give its ``noise_every`` too, and, for a run that held its batch, ``noise_until``: its
    ``held_from``, from which no step is split to measure the noise).

    ``balanced=True`` deals every step to every replica as the same number of whole micro-batches
    (Megatron's condition; no replica idle or ragged), so every batch must be a multiple of
    ``micro_batch x num_replicas``. It is checked when iteration starts, from the current step
    on: a run resumed on another number of replicas needs only the steps still to train to fit it
    (Megatron #3913), and ``ElasticState.restore()`` refuses a world that does not fit them,
    naming the world sizes that do.

    :class:`~aikit.elastic.Torch.AdaptiveSampler` extends it with batches decided while training;
    every public name of one works on the other, or says why it does not apply (``controller``).
    ``micro_name`` is what messages call the micro-batch (eth-easl's ``CustomSampler`` passes
    ``"minibatch_size"`` where its user wrote that).
    """

    _decides_while_training = False  # True for AdaptiveSampler: its epochs grow while training
    balanced = False  # every step in equal whole micro-batches on every replica (checked from the current step on)

    def __init__(self, dataset: Sized | int | None = None, trace: Trace | str | list[int] | int | None = None, *,
                 micro_batch: int | None = None, num_replicas: int | None = None, rank: int | None = None,
                 seed: int = 42, dataset_size: int | None = None, shuffle: bool = True,
                 permutation: str | Permutation = "numpy", when_exhausted: str | None = None,
                 strict_steps: bool = False, max_device_batch: int | None = None, min_micro_batches: int = 1,
                 noise_every: int | None = None, balanced: bool = False, noise_until: int | None = None,
                 micro_name: str = "micro_batch"):
        size = dataset_size_of(dataset, dataset_size, type(self).__name__)
        self.balanced = checked_bool(balanced, "balanced")
        if trace is None:
            raise InvalidValue(f"{type(self).__name__} needs a trace: a 'step,batchsize' CSV path, a list of sizes or "
                               "an int")
        order = PERMUTATIONS.get(permutation) if isinstance(permutation, str) else permutation
        if order is None:
            raise InvalidValue(f"permutation must be one of {sorted(PERMUTATIONS)} or a function "
                               f"(seed, epoch, dataset_size) -> order, got {permutation!r}")
        if num_replicas is None or rank is None:
            engine_replicas, engine_rank = distributed.world_size(), distributed.rank()
            num_replicas = engine_replicas if num_replicas is None else num_replicas
            rank = engine_rank if rank is None else rank
        trace = load_trace(trace, when_exhausted, strict_steps=strict_steps)
        self.devices = distributed.spmd_devices()  # an SPMD process feeds every device of its mesh at once
        name, micro = micro_name, micro_batch
        if self.balanced and max_device_batch is not None:
            raise InvalidValue(f"balanced deals whole micro-batches of {name} to every replica; "
                               "max_device_batch splits every step evenly already: give one of them")
        if max_device_batch is not None and (micro is not None or self.devices > 1):
            raise InvalidValue(
                f"give {name} (one micro-batch size, static shapes) or max_device_batch (each step split "
                "evenly, its micro-batch growing with it), not both"
                + (f"; under SPMD every micro-step needs one shape: use {name}" if self.devices > 1 else ""))
        if max_device_batch is None:
            micro = spmd.micro_batch(trace, 32 if micro is None else micro, self.devices, name)
            self.schedule = Schedule(trace, size, num_replicas, seed=seed, shuffle=shuffle, permutation=order,
                                     noise_every=noise_every, noise_until=noise_until, micro_batch=micro,
                                     micro_name=name)
        else:
            self.schedule = Schedule(trace, size, num_replicas, seed=seed, shuffle=shuffle, permutation=order,
                                     max_device_batch=max_device_batch, min_micro_batches=min_micro_batches,
                                     noise_every=noise_every, noise_until=noise_until)
        self.rank = checked_rank(rank, self.schedule.num_replicas)
        self.set_epoch(0)

    def __bool__(self) -> bool:
        return True  # a sampler is there even when len() is 0 (the epoch's steps all done)

    @property
    def permutation(self) -> str:
        """Which sample order: ``"numpy"``, ``"torch"`` or the function's ``module.qualname``."""
        order = self.schedule.permutation
        known = [name for name, function in PERMUTATIONS.items() if function is order]
        return known[0] if known else f"{order.__module__}.{getattr(order, '__qualname__', repr(order))}"

    def identity(self) -> dict:
        """What fixes every step's samples: the trace's sizes (a SHA-256), where it came from, its
        end policy, the data set size, the seed, shuffle and sample order (an adaptive run: its
        settings). A resumed run (``ElasticState``) and every replica of a run must have the same."""
        schedule = self.schedule
        if hasattr(schedule, "identity"):  # an adaptive run: its settings fix the batches it decides
            return schedule.identity()
        trace = schedule.trace
        return {"trace": hashlib.sha256(trace.sizes.tobytes()).hexdigest(), "trace_source": trace.source,
                "when_exhausted": trace.when_exhausted, "dataset_size": schedule.dataset_size, "seed": schedule.seed,
                "shuffle": schedule.shuffle, "permutation": self.permutation}

    @property
    def seed(self) -> int:
        return self.schedule.seed

    @cached_property
    def trace(self) -> list[int]:
        """The trace's batch sizes in file order (what follows the last is the trace's policy;
        eth-easl's int trace was 2,000,000 copies, aikit's is one that repeats)."""
        return self.schedule.trace.sizes.tolist()

    # --- aikit's surface, shared with AdaptiveSampler -------------------------------------------
    def write_trace(self, path: str | os.PathLike) -> None:
        """Write :attr:`trace` as a ``step,batchsize`` CSV (the end-of-trace policy is not part of it)."""
        Trace(self.trace, source=type(self).__name__).to_csv(path)

    @property
    def lookahead(self) -> int | float:
        """Updates decided ahead of training, which bounds how far a DataLoader may prefetch: a
        trace is decided to its end (``math.inf``); an AdaptiveSampler's is a number."""
        return math.inf

    @lookahead.setter
    def lookahead(self, value: int) -> None:
        raise InvalidValue(f"a {type(self).__name__}'s trace is decided to its end, so a DataLoader may prefetch "
                           "as far as it likes: there is no lookahead to set (AdaptiveSampler has one)")

    def loader(self, dataset: Any, **kwargs: Any) -> torch.utils.data.DataLoader:
        """A DataLoader over ``dataset`` fed by this sampler (as its ``batch_sampler``), with the
        lookahead its prefetching needs (``num_workers x prefetch_factor`` micro-batches)."""
        if "batch_size" in kwargs or "sampler" in kwargs or "batch_sampler" in kwargs:
            raise InvalidValue("this sampler sets the batches: leave batch_size, sampler and batch_sampler out")
        workers = kwargs.get("num_workers", 0)
        prefetch = kwargs.get("prefetch_factor") or (2 if workers else 0)
        if workers * prefetch > self.lookahead:
            self.lookahead = workers * prefetch
        return torch.utils.data.DataLoader(dataset, batch_sampler=self, **kwargs)

    @property
    def controller(self) -> Any:
        """Refused: the batch of every step is the trace's, chosen by no controller."""
        raise AttributeError(f"a {type(self).__name__} follows a trace given in advance: no controller chooses its "
                             "batches; "
                             "AdaptiveSampler(dataset, ref_batch_size=..., max_batch=...) has one")

    @property
    def interval(self) -> int:
        """Refused: a trace is decided in advance, not every few updates."""
        raise AttributeError(f"a {type(self).__name__} follows a trace given in advance: it makes no decisions, so it "
                             "has no "
                             "interval between them; AdaptiveSampler has one")

    @property
    def num_replicas(self) -> int:
        return self.schedule.num_replicas

    @property
    def micro_batch(self) -> int | None:
        """Samples per device in a micro-batch (an SPMD micro-batch spans ``devices`` of them); None
        where each step has its own (``max_device_batch``)."""
        micro = self.schedule.micro_batch
        return None if micro is None else micro // self.devices

    @property
    def dataset_size(self) -> int:
        return self.schedule.dataset_size

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` at its beginning; right after a resume, a call for the resumed epoch
        keeps the position (the training loop calls it either way)."""
        if not (self._resumed and epoch == self.epoch):
            self.epoch_schedule = self.schedule.epoch(epoch)
            self._start = (0, 0)  # where the next iteration begins
            self.step, self.micro_step = self._start  # the live position, which state_dict() records
        self._resumed = False

    _resumed = False

    @property
    def epoch(self) -> int:
        return self.epoch_schedule.epoch

    def __iter__(self) -> Iterator[list[int]]:
        """This replica's micro-batches of the epoch (from the loaded position after a resume)."""
        plan: EpochSchedule = self.epoch_schedule
        self._begin()
        self.check_world()
        while self.step < len(plan):
            yield from self._rest_of_step(plan)

    def check_world(self) -> None:
        """With ``balanced``: refuse a world that cannot take equal whole micro-batches of every step
        still to train, naming the world sizes that can."""
        if self.balanced:
            problem = world_problem(self.schedule.trace, self.epoch_schedule.first_step + self.step,
                                    self.schedule.micro_batch, self.num_replicas)
            if problem:
                raise InvalidValue(f"balanced sampler: {problem}")

    def _begin(self) -> None:
        """Iteration starts at ``_start`` (the loaded position, or the epoch's beginning)."""
        (self.step, self.micro_step), self._start, self._resumed = self._start, (0, 0), False

    def _rest_of_step(self, plan: EpochSchedule) -> Iterator[list[int]]:
        """This replica's micro-batches of the current step from the current one, then the next step."""
        batches = plan.micro_batches(self.step, self.rank)
        while self.micro_step < len(batches):
            batch = batches[self.micro_step].tolist()
            self.micro_step += 1
            yield batch
        self.step, self.micro_step = self.step + 1, 0

    def __len__(self) -> int:
        """Micro-batches the next iteration yields (the whole epoch unless resumed mid-epoch)."""
        step, micro_step = self._start
        return int(self.epoch_schedule.counts(self.rank)[step:].sum()) - micro_step

    def state_dict(self) -> dict:
        """Where iteration stands: epoch, step of the epoch, micro-batches yielded of that step.

        With DataLoader workers the sampler runs ahead of training; the trace optimizer's
        ``state_dict`` records what was trained and repositions this sampler when loaded.
        """
        return {"epoch": self.epoch, "step": self.step, "micro": self.micro_step, "seed": self.schedule.seed,
                "rank": self.rank, "num_replicas": self.num_replicas, "permutation": self.permutation}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next ``set_epoch(state['epoch'])`` keeps the position."""
        permutation = state.get("permutation", "numpy")  # states from before the option
        if (state["seed"], state["num_replicas"], permutation) != (self.seed, self.num_replicas, self.permutation):
            raise InvalidValue(
                f"sampler state is for seed {state['seed']}, {state['num_replicas']} replicas and permutation "
                f"{permutation!r}, this sampler has seed {self.seed}, {self.num_replicas} and {self.permutation!r}: "
                "build it with the settings of the run that saved it"
            )
        self.resume(state["epoch"], state["step"], state["micro"])

    def set_world(self, num_replicas: int, rank: int) -> None:
        """Deal the same schedule to a new world (an elastic resize): every step keeps its global
        batch and samples, only their deal to replicas changes. Position: the start of the
        current step (a step cut short by the resize is retrained)."""
        old = self.schedule
        self.schedule = Schedule(old.trace, old.dataset_size, num_replicas, old.micro_batch, seed=old.seed,
                                 shuffle=old.shuffle, balanced=old.balanced, permutation=old.permutation,
                                 micro_name=old.micro_name, max_device_batch=old.max_device_batch,
                                 min_micro_batches=old.min_micro_batches, noise_every=old.noise_every,
                                 noise_until=old.noise_until)
        self.rank = checked_rank(rank, num_replicas)
        self.resume(self.epoch, self.step, 0)

    def check_position(self, epoch: int, step: int, micro_step: int, name: str = "",
                       fix: str = "") -> EpochSchedule:
        """The schedule of ``epoch`` if micro-batch ``micro_step`` of ``step`` exists for this rank; else
        the field out of range, its range, and ``fix`` (``name`` says whose position it is)."""
        plan = self.schedule.epoch(epoch)
        counts = plan.counts(self.rank)
        fix = f"; {fix}" if fix else ""
        if not 0 <= step <= len(counts):
            raise InvalidValue(f"{name}step must be an integer in 0..{len(counts)} (epoch {epoch}'s {len(counts)} "
                               f"steps, {len(counts)} once they are done), got {step}{fix}")
        mine = int(counts[step]) if step < len(counts) else 0
        if not 0 <= micro_step <= mine:
            raise InvalidValue(f"{name}micro must be an integer in 0..{mine} (rank {self.rank}'s micro-batches of step "
                               f"{step} in epoch {epoch}), got {micro_step}{fix}")
        return plan

    def resume(self, epoch: int, step: int, micro_step: int) -> None:
        """Position at micro-batch ``micro_step`` of ``step`` of ``epoch``; kept by ``set_epoch(epoch)``."""
        plan = self.check_position(epoch, step, micro_step)
        self.epoch_schedule, self._start, self._resumed = plan, (step, micro_step), True
        self.step, self.micro_step = step, micro_step


def checked_rank(rank: object, num_replicas: int) -> int:
    return index_in(rank, "rank", num_replicas)


def dataset_size_of(dataset: Sized | int | None, dataset_size: int | None, user: str) -> int:
    """The data set's size from a sized Dataset or an int (``dataset_size=`` says the same)."""
    if dataset is not None and dataset_size is not None:
        raise InvalidValue("give the data set or dataset_size=, not both")
    if dataset is None and dataset_size is None:
        raise InvalidValue(f"{user} needs the data set (or its size) as first argument, or dataset_size=")
    source = dataset if dataset is not None else dataset_size
    if isinstance(source, Integral) or dataset is None:
        return source  # validated by the Schedule
    if isinstance(source, (str, bytes, float)) or not isinstance(source, Sized):
        raise InvalidType(
            f"{user} needs a sized Dataset or an int, got {type(source).__name__} "
            f"{source!r:.40}: pass the Dataset, or its size as an int (dataset_size=1000)"
        )
    return len(source)
