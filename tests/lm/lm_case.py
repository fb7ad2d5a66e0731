"""The language-model runs tests/lm compares, shared by its torchrun and horovodrun workers and
its tests: a tiny float64 transformer on variable-length sequences of the standard library's
sources, and the one-process big-batch reference.

Each case is a sequence of update *windows* (sequence indices; a window shorter than the global
batch is an epoch's last, partial update, ended by ``flush()``). The reference trains one process
on each whole window at once: one loss, the mean over every token of the window whose label is not
ignored (``loss="tokens"``), or the mean over its sequences of their summed token losses / CONTEXT
(``loss="samples"``, a per-sample mean). Under GA each rank takes its micro-batches of the window
by the elastic plan and declares what its micro-batch's mean is over (``accumulate(model,
weight=tokens)`` or ``samples=``). Some sequences are prompts whose labels are all ignored, so
micro-batches hold very different numbers of tokens, some none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from aikit.datasets import IGNORE, pad_batch, stdlib_text

SEQUENCES, CONTEXT, WIDTH = 48, 24, 8


def sequences() -> list[np.ndarray]:
    """Byte sequences of 2 to CONTEXT + 1 tokens (pieces of paragraphs cut to lengths that
    vary), the same on every process."""
    train, _ = stdlib_text(max_len=CONTEXT, max_bytes=20_000, val_fraction=0, min_len=2)
    return [piece[:2 + (11 * index) % CONTEXT] for index, piece in enumerate(train[:SEQUENCES])]


def is_prompt(index: int) -> bool:
    """Sequences whose labels are all ignored (an instruction-tuning prompt)."""
    return index % 5 == 2


def batch(data: list[np.ndarray], indices) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)`` of the sequences ``indices``, padded to the longest; (0, 1) for none."""
    if not len(indices):
        return torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1, dtype=torch.long)
    inputs, labels = pad_batch([data[i] for i in indices])
    for row, index in enumerate(indices):
        if is_prompt(int(index)):
            labels[row] = IGNORE
    return torch.from_numpy(inputs), torch.from_numpy(labels)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.qkv, self.out = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, 2, w // 2).transpose(1, 3).unbind(2)
        return x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w))


class TinyLM(nn.Module):
    """A one-block causal transformer over bytes (right padding never reaches a real token)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(256, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.block, self.head = Block(), nn.Linear(WIDTH, 256)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.tokens(inputs) + self.positions(torch.arange(inputs.shape[1]))
        return self.head(self.block(x))


def model(seed: int = 100, dtype: torch.dtype = torch.float64) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM().to(dtype)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean over the tokens whose label is not ignored (NaN with none)."""
    return F.cross_entropy(logits.flatten(0, 1).float() if logits.dtype == torch.bfloat16 else logits.flatten(0, 1),
                           labels.flatten(), ignore_index=IGNORE)


def sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A per-sample mean: each sequence's summed token losses / CONTEXT, averaged over the sequences."""
    per_token = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none")
    return per_token.view(labels.shape).sum(1).mean() / CONTEXT


@dataclass(frozen=True)
class Case:
    """One run: global batch ``G`` (sequences), max micro-batch ``M``, window lengths, settings."""

    name: str
    G: int
    M: int
    windows: tuple[int, ...]
    engines: tuple[str, ...]  # where it runs: "ddp", "fsdp", "reduce" (torchrun), "horovod" (horovodrun)
    declare: str = "weight"  # accumulate(weight=tokens), or samples=, or "none" (equal micro-batches)
    optimizer: str = "adamw"
    max_grad_norm: float | None = None
    scheduler: bool = False
    sync_every_micro_step: bool = False  # FSDP2: reduce-scatter every micro-step
    bf16: bool = False  # FSDP2 MixedPrecisionPolicy(bfloat16, reduce float32); float32 parameters

    @property
    def loss(self):
        return token_loss if self.declare == "weight" else sample_loss

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32 if self.bf16 else torch.float64

    def window_indices(self) -> list[np.ndarray]:
        """Consecutive pieces of one fixed permutation per pass over the sequences."""
        order, out, start, epoch = np.random.default_rng([2, 0]).permutation(SEQUENCES), [], 0, 0
        for length in self.windows:
            if start + length > SEQUENCES:
                epoch += 1
                order, start = np.random.default_rng([2, epoch]).permutation(SEQUENCES), 0
            out.append(order[start:start + length])
            start += length
        return out

    def inner(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.3, momentum=0.9, weight_decay=0.01)
        return torch.optim.AdamW(params, lr=0.02, weight_decay=0.01)

    def schedule(self, optimizer: torch.optim.Optimizer):
        """The LR halved every update (None without ``scheduler``)."""
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5) if self.scheduler else None


CASES = (
    # 8 sequences in micro-batches of at most 2: 2 ranks x 2 GA steps; 3 ranks: a ragged plan
    Case("tokens-even", 8, 2, (8, 8, 8), ("ddp", "fsdp", "reduce", "horovod"), max_grad_norm=0.5, scheduler=True),
    # 7: [2, 2] then [2, 1] on 2 ranks, [2, 2, 2] then [1, 0, 0] on 3 (idle ranks join with nothing)
    Case("tokens-ragged", 7, 2, (7, 7, 7), ("ddp", "fsdp", "reduce", "horovod"), optimizer="sgd", max_grad_norm=1.0),
    # epochs' last, partial windows (flush()): where the GA engine sums the gradients itself
    Case("tokens-partial", 8, 2, (8, 5, 8, 3), ("reduce", "horovod"), max_grad_norm=0.5, scheduler=True),
    # FSDP2's other trade-off: a reduce-scatter every micro-step
    Case("tokens-every-micro-step", 7, 2, (7, 7, 7), ("fsdp",), sync_every_micro_step=True, max_grad_norm=0.5),
    # FSDP2 with samples= on a ragged plan (weights at the outputs), and plain equal micro-batches
    Case("samples-ragged", 7, 2, (7, 7, 7), ("ddp", "fsdp", "reduce"), declare="samples", max_grad_norm=0.5),
    Case("plain-even", 12, 2, (12, 12), ("fsdp",), declare="none", scheduler=True),
    # bf16 compute, float32 reduction and accumulation
    Case("tokens-bf16", 8, 2, (8, 8), ("fsdp",), optimizer="sgd", bf16=True),
)


def reference(case: Case, seed: int = 100) -> dict:
    """One process, one real step per window on all its sequences at once: the final
    parameters, the first update's gradient (clipped) and every update's LR."""
    data, net = sequences(), model(seed, case.dtype)
    opt = case.inner(net.parameters())
    scheduler = case.schedule(opt)
    first, lrs = None, []
    for window in case.window_indices():
        opt.zero_grad()
        inputs, labels = batch(data, window)
        case.loss(net(inputs), labels).backward()  # float32 for a bf16 case: what bf16 approximates
        if case.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), case.max_grad_norm)
        if first is None:
            first = [p.grad.detach().clone() for p in net.parameters()]
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return {"params": [p.detach().clone() for p in net.parameters()], "first_grads": first, "lrs": lrs}


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient whole, gathered from its shards (FSDP2's DTensors)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def train(case: Case, engine: str) -> dict:
    """Train ``case`` on this rank with aikit's GA on ``engine`` (the process group or Horovod
    initialised by the caller)."""
    import torch.distributed as dist

    import aikit.elastic.Torch
    from aikit.core.plan import micro_batch_slices
    from aikit.elastic.Torch import distributed
    from aikit.ga.Torch.optim import Optimizer, UpdateScheduler

    rank = distributed.rank()
    plan = aikit.elastic.Torch.init(case.G, case.M)
    data, net = sequences(), model(dtype=case.dtype)
    counts = {"allreduces": 0, "reduce_scatters": 0}
    wrapped = net
    if engine == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(net)

        def counting_allreduce(state, bucket):
            state["allreduces"] += bucket.is_last()
            return default_hooks.allreduce_hook(None, bucket)

        wrapped.register_comm_hook(counts, counting_allreduce)
    elif engine == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if case.bf16 \
            else MixedPrecisionPolicy()
        fully_shard(net.block, mp_policy=policy)
        wrapped = fully_shard(net, mp_policy=policy)
    inner = case.inner(net.parameters())
    options = {"max_grad_norm": case.max_grad_norm}
    if engine == "horovod":
        from aikit.elastic.Torch import horovod

        optimizer = horovod.DistributedOptimizer(inner, plan.steps, **options)
    else:
        optimizer = Optimizer(inner, plan.steps, reduce=engine == "reduce",
                              sync_every_micro_step=case.sync_every_micro_step, **options)
    scheduler = None if not case.scheduler else UpdateScheduler(case.schedule(optimizer))
    first, lrs = [], []
    def record(*_) -> None:  # before the real update: its weighted, clipped gradient and its LR
        if not first:
            first.extend(full(p.grad).detach().clone() for p in net.parameters())
        lrs.append(inner.param_groups[0]["lr"])

    optimizer.register_step_pre_hook(record)
    reduce_scatter = dist.reduce_scatter_single

    def counting_reduce_scatter(*args, **kwargs):
        counts["reduce_scatters"] += 1
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = counting_reduce_scatter
    mine, whole = micro_batch_slices(plan, rank), micro_batch_slices(plan)
    tokens, per_update = [], []  # this rank's tokens in each micro-step; the collectives of each update
    try:
        for window in case.window_indices():
            before = dict(counts)
            for step_slice, my_slice in zip(whole, mine, strict=True):
                if step_slice.start >= len(window):
                    break  # no rank has a sequence in this GA step of the short window
                inputs, labels = batch(data, window[my_slice])
                terms = (labels != IGNORE).sum()
                declared = {"weight": {"weight": terms}, "samples": {"samples": len(inputs)}}.get(case.declare, {})
                with optimizer.accumulate(wrapped, **declared), \
                        torch.autocast("cpu", torch.bfloat16, enabled=case.bf16 and engine != "fsdp"):
                    case.loss(wrapped(inputs), labels).backward()
                tokens.append(int(terms))
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            if optimizer.flush() and scheduler is not None:
                scheduler.step()
            per_update.append({key: counts[key] - before[key] for key in counts})
    finally:
        dist.reduce_scatter_single = reduce_scatter
    assert optimizer.micro_step == 0
    return {
        "params": [full(p).detach().clone() for p in net.parameters()],
        "first_grads": first,
        "lrs": lrs,
        "tokens": tokens,
        "collectives": per_update,
        "steps": plan.steps,
    }


def run_all(engines: tuple[str, ...], world: int) -> dict:
    """Every case of ``engines`` on this rank: ``{case: {engine: result}}``."""
    results: dict = {}
    for case in CASES:
        for engine in engines:
            if engine in case.engines and not (world == 3 and engine != "fsdp"):
                results.setdefault(case.name, {})[engine] = train(case, engine)
    return results


# --- the trace optimizers: each step's global batch from a trace, its count in their all-reduce ---
TRACE, MICRO = (8, 6, 2, 8, 4), 2  # in micro-batches of 2: 2 replicas get 2 and 1 of 3, or 1 and none of 1


def trace_sampler(replicas: int, rank: int):
    from aikit.elastic.Torch import CustomSampler

    return CustomSampler(SEQUENCES, list(TRACE), num_replicas=replicas, rank=rank, micro_batch=MICRO,
                         when_exhausted="stop")


def trace_reference(seed: int = 100) -> dict:
    """One process, each step of the trace's first epoch on its whole global batch, the LR
    scaled by the linear rule (reference batch 8), gradients clipped to 0.5."""
    data, net = sequences(), model(seed)
    epoch = trace_sampler(1, 0).schedule.epoch(0)
    opt = torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.9)
    first = None
    for step in range(len(epoch)):
        opt.zero_grad()
        inputs, labels = batch(data, epoch.step_indices(step))
        token_loss(net(inputs), labels).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        first = first or [p.grad.detach().clone() for p in net.parameters()]
        opt.param_groups[0]["lr"] = 0.3 * len(epoch.step_indices(step)) / 8
        opt.step()
    return {"params": [p.detach().clone() for p in net.parameters()], "first_grads": first}


def train_trace() -> dict:
    """The trace's first epoch with LinearRuleOptimizer and ``accumulate(model, weight=tokens)`` on
    this process's micro-batches (the process group, if any, initialised by the caller)."""
    from aikit.elastic.Torch import LinearRuleOptimizer, distributed

    data, net = sequences(), model()
    sampler = trace_sampler(distributed.world_size(), distributed.rank())
    optimizer = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.9), sampler,
                                    ref_batch_size=8, max_grad_norm=0.5)
    first = []
    optimizer.register_step_pre_hook(lambda *_: None if first else first.extend(
        p.grad.detach().clone() for p in net.parameters()))
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    tokens = []
    for indices in sampler:
        inputs, labels = batch(data, indices)
        tokens.append(int((labels != IGNORE).sum()))
        with optimizer.accumulate(net, weight=(labels != IGNORE).sum()):
            token_loss(net(inputs), labels).backward()
        optimizer.step()
    return {"params": [p.detach().clone() for p in net.parameters()], "first_grads": first, "tokens": tokens,
            "updates": optimizer.updates}
