"""Everything checked before a commit is loaded: a failed restore leaves every kept object as it was.

A commit is refused, naming why and the fix, when its own fields are not aikit's (a hand-edited
file with a valid checksum), when its samples per step differ (the schedule's identity) or its
global batch does (where the caller knows the run's: Ray's workers), when it
keeps other objects or other kinds of object under the same names, when an object's state does
not fit (a model's keys and shapes, an optimizer's groups, a shard's shape), or when the steps
a balanced sampler has still to train do not fit the world that resumes.

A kept object's *kind* (its class, a wrapper's with the optimizer it wraps) is written with every
commit; :func:`same_kind` is the one place a saved kind meets a present one.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from aikit.core.errors import AikitError, InvalidValue
from aikit.core.schedule import world_problem
from aikit.core.validate import checked_float, positive_int
from aikit.elastic.Torch import checkpoint
from aikit.elastic.Torch.encoding import sharded_refs
from aikit.elastic.Torch.layout import shard_template
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.runtime.process import TORCH, plan_of
from aikit.runtime.Torch import distributed, random_state
from aikit.runtime.Torch.lr_free import SCHEDULE_FREE, lr_free_kind
from aikit.runtime.Torch.state_checks import check_groups
from aikit.runtime.Torch.wrapping import WrappingOptimizer

FORMAT = 2  # 2: the kinds of the kept objects, sharded commits; 1 (aikit 0.2) still restores

# ElasticState records each kept object's class as "module.qualname" (a trace optimizer's with the
# optimizer it wraps) and refuses a restore whose class differs. These classes moved when the trace
# optimizers became one, and eth-easl's names moved to its edge (old path -> new path): a commit written
# before names the old path.
MOVED_CLASSES = {
    "aikit.elastic.Torch.trace_optim.LinearRuleOptimizer": "aikit.elastic.Torch.eth_easl.LinearRuleOptimizer",
    "aikit.elastic.Torch.trace_optim.RootRuleOptimizer": "aikit.elastic.Torch.eth_easl.RootRuleOptimizer",
    "aikit.elastic.Torch.trace_optim.SeesawOptimizer": "aikit.elastic.Torch.eth_easl.SeesawOptimizer",
    "aikit.elastic.Torch.trace_optim.ConstantOptimizer": "aikit.elastic.Torch.eth_easl.ConstantOptimizer",
    "aikit.elastic.Torch.trace_optim.CustomOptimizer": "aikit.elastic.Torch.eth_easl.CustomOptimizer",
    "aikit.elastic.Torch.trace_optim.LinearRuleMomentumOptimizer":
        "aikit.elastic.Torch.eth_easl.LinearRuleMomentumOptimizer",
    "aikit.elastic.Torch.trace_optim.AdaScaleOptimizer": "aikit.elastic.Torch.eth_easl.AdaScaleOptimizer",
    "aikit.elastic.Torch.adascale.AdaScaleOptimizer": "aikit.elastic.Torch.eth_easl.AdaScaleOptimizer",
}


def kind(obj) -> str | None:
    """What a kept object is, for the restore check: its class (a wrapper's with the optimizer
    it wraps); ``"module"`` for any model (checked by keys and shapes: its class may be renamed);
    None for a plain value."""
    if isinstance(obj, torch.nn.Module):
        return "module"
    if not hasattr(obj, "state_dict"):
        return None
    name = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if not isinstance(obj, WrappingOptimizer):
        return name
    return f"{name}({type(obj.optimizer).__module__}.{type(obj.optimizer).__qualname__})"


def same_kind(saved: str | None, now: str | None) -> bool:
    """Whether an object of kind ``saved`` (as a commit wrote it) restores into one of kind
    ``now``: every comparison of a saved kind with a present one is this one (a class that
    moves between modules is matched here, through :data:`MOVED_CLASSES`)."""
    if saved is None:
        return now is None
    cls, paren, inner = saved.partition("(")
    return f"{MOVED_CLASSES.get(cls, cls)}{paren}{inner}" == now


def schedule_identity(optimizer: TraceOptimizer | None) -> dict | None:
    """What fixes every step's samples: a resumed run must have the same."""
    return None if optimizer is None else optimizer.sampler.identity()


def planned_global_batch() -> int | None:
    """The global batch of the plan the last ``init()`` published (None before one)."""
    plan = plan_of(TORCH)
    return None if plan is None else plan.global_batch_size


def check_commit(payload: dict, objects: dict, optimizer: TraceOptimizer | None, directory: Path,
                 global_batch: int | None = None) -> None:
    """Every reason ``payload`` cannot be restored into the kept ``objects`` (``optimizer``: the
    trace optimizer among them; ``global_batch``: the run's, None where unknown): the
    commit's own fields, its schedule and global batch, the objects it keeps (the same names and
    kinds), every object's state, the shards' shapes, the world."""
    if not isinstance(payload, dict) or payload.get("format") not in (1, FORMAT):
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise InvalidValue(f"{checkpoint.newest_file(directory)} is not an aikit ElasticState checkpoint (format "
                           f"{found!r})")
    try:
        positive_int(payload.get("commit"), "its commit number")
        positive_int(payload.get("world_size"), "its world_size")
        checked_float(payload.get("time"), "its time", "a finite number")
        random_state.check_state(payload.get("rng"))
        if not isinstance(payload.get("objects"), dict):
            raise InvalidValue("its objects are not a dict")
        training = payload.get("train_mode", [])
        if not isinstance(training, list) or any(
                not isinstance(name, str) or lr_free_kind(objects.get(name)) != SCHEDULE_FREE for name in training):
            raise InvalidValue(f"its train_mode {training!r} names what is not a kept Schedule-Free optimizer")
    except AikitError as error:
        raise InvalidValue(f"the checkpoint {checkpoint.newest_file(directory)} was not written by aikit as it is: "
                           f"{error}; restore an intact commit (was it edited?)") from error
    _check_schedule(payload["schedule"], schedule_identity(optimizer), directory)
    _check_global_batch(payload.get("global_batch_size"), global_batch, directory)
    saved = payload["objects"]
    _check_names(saved, payload.get("kinds"), objects, directory)
    # models first: a model that does not fit is the cause of an optimizer state that does not
    for name, obj in sorted(objects.items(), key=lambda item: not isinstance(item[1], torch.nn.Module)):
        try:
            if hasattr(obj, "check_state"):  # aikit's optimizers check their own
                obj.check_state(saved[name])
            elif isinstance(obj, torch.nn.Module):
                _check_module(obj, saved[name])
            elif isinstance(obj, torch.optim.Optimizer):
                check_groups(obj, saved[name])
            for path, ref in sharded_refs(saved[name]):
                shard_template(obj, path, ref)
        except ValueError as error:
            raise InvalidValue(f"the checkpoint {checkpoint.newest_file(directory)} cannot be restored into "
                               f"{name}=: {error}") from error
    _check_world(saved, objects, optimizer, directory)


def _check_schedule(saved: dict | None, now: dict | None, directory: Path) -> None:
    if saved is None or now is None:
        return
    saved = {"permutation": "numpy", **saved}  # commits from before the permutation option
    differ = [f"{key} {saved.get(key)!r} then, {now[key]!r} now" for key in now
              if key != "trace_source" and saved.get(key) != now[key]]
    if differ:
        what = "; ".join(d if not d.startswith("trace ") else
                         f"trace {saved['trace_source']} then, {now['trace_source']} now (different sizes)"
                         for d in differ)
        raise InvalidValue(
            f"the checkpoint {checkpoint.newest_file(directory)} was written by a run with other samples per step "
            f"({what}): resume with the same trace, data set, seed, shuffle and permutation, or start from an "
            "empty directory"
        )


def _check_global_batch(saved: object, now: int | None, directory: Path) -> None:
    if saved is None or now is None or saved == now:
        return
    raise InvalidValue(
        f"the checkpoint {checkpoint.newest_file(directory)} was written by a run of global batch {saved!r} "
        f"(init({saved!r}, ...)), this one plans {now} per update: a resize keeps the global batch, so resume with "
        f"init({saved!r}, ...), or start from an empty directory")


def _check_names(saved: dict, kinds: dict | None, objects: dict, directory: Path) -> None:
    """The same objects under the same names, each of the same kind. An object kept then and
    not now is refused (its state would be lost: a scheduler's LR), a plain value warned about."""
    missing = sorted(set(objects) - set(saved))
    if missing:
        raise InvalidValue(
            f"the checkpoint {checkpoint.newest_file(directory)} holds {sorted(saved)} but not {missing}: keep the "
            "same objects as the run that wrote it, or start from an empty directory"
        )
    kinds = kinds if isinstance(kinds, dict) else {}  # format 1 recorded none
    extra = sorted(set(saved) - set(objects))
    stateful = [name for name in extra if kinds.get(name) is not None]
    if stateful:
        raise InvalidValue(
            f"the checkpoint {checkpoint.newest_file(directory)} keeps "
            f"{', '.join(f'{n}= (a {kinds[n]})' for n in stateful)} as well, which this ElasticState does not: its "
            f"state would be lost. Keep it (ElasticState(..., {stateful[0]}=...)), or start over in another directory")
    if extra:
        warnings.warn(f"aikit: the checkpoint {checkpoint.newest_file(directory)} keeps the value(s) {extra} as well, "
                      "which this ElasticState does not keep: they are not restored", stacklevel=4)
    for name, obj in objects.items():
        then, now = kinds.get(name), kind(obj)
        if name in kinds and not same_kind(then, now):
            raise InvalidValue(
                f"the checkpoint {checkpoint.newest_file(directory)} keeps a {then or 'plain value'} as {name}=, this "
                f"ElasticState a {now or 'plain value'}: its state does not fit; keep the same kind of object under "
                "each name")


def _check_module(module: torch.nn.Module, saved: dict) -> None:
    """Refuse a state dict whose keys or shapes do not fit ``module``."""
    if not isinstance(saved, dict):
        raise InvalidValue(f"a module's state dict must be a dict, got {type(saved).__name__}")
    have = module.state_dict()
    missing, unexpected = sorted(set(have) - set(saved)), sorted(set(saved) - set(have))
    if missing or unexpected:
        raise InvalidValue(f"the saved model lacks {missing} and has {unexpected} besides: build the same model")
    for key, value in have.items():
        got = getattr(saved[key], "shape", None)
        if got is not None and tuple(got) != tuple(value.shape):
            raise InvalidValue(f"{key} has shape {tuple(got)} in the checkpoint, {tuple(value.shape)} here")


def _check_world(saved: dict, objects: dict, optimizer: TraceOptimizer | None, directory: Path) -> None:
    """A balanced sampler (every replica the same whole micro-batches of every step) whose
    steps still to train do not fit this world is refused with the world sizes that do
    (Megatron #3913); the steps trained before need not fit."""
    if optimizer is None or not getattr(optimizer.sampler, "balanced", False):
        return
    name = next(name for name, obj in objects.items() if obj is optimizer)
    position, schedule = saved[name]["trace"], optimizer.sampler.schedule
    first = schedule.epoch_bounds(position["epoch"])[0] + position["step"]
    problem = world_problem(schedule.trace, first, schedule.micro_batch, distributed.world_size())
    if problem:
        raise InvalidValue(f"the checkpoint {checkpoint.newest_file(directory)} cannot resume on "
                           f"{distributed.world_size()} replica(s): {problem}; resume on one of those, or with another "
                           "trace")
