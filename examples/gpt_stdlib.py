"""A small GPT trained on the Python standard library's own sources, with token-weighted GA.

Real text on every machine, no download: ``aikit.datasets.stdlib_text`` cuts the standard
library's ``.py`` files into paragraphs of varying length (byte tokens). Each update takes a
global batch of sequences, split by the elastic plan into micro-batches per device and GA step;
each micro-batch is padded to its longest sequence, and its loss is the mean over its tokens whose
label is not ignored. ``optimizer.accumulate(model, weight=tokens)`` makes the update the mean
over every token of the global batch, as one big batch would, not the mean of the micro-batch
means (transformers #34191, torchtune #1875):

    python examples/gpt_stdlib.py                          # one process: 4 GA steps of 8 sequences
    torchrun --nproc-per-node 2 examples/gpt_stdlib.py     # 2 processes, FSDP2: 2 GA steps of 8 each
    python examples/gpt_stdlib.py --quick                  # a few updates of a smaller model

It prints the plan, the training loss and tokens per second as it goes, and the validation loss
(nats per byte) at the end; it exits 1 when that misses ``--target``. Under torchrun the model is
sharded with FSDP2 (``fully_shard`` per block and at the root), which reduce-scatters once per
update; ``--bf16`` trains under ``torch.autocast(bfloat16)`` (FSDP2: ``MixedPrecisionPolicy`` with
float32 reduction), the gradients accumulating in float32.

Other scripts train the same language model (the examples folder on ``sys.path``)::

    from gpt_stdlib import TinyGPT, token_loss, update_micro_batches, validation_loss, windows
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import aikit.elastic.Torch
from aikit.core.plan import Plan, micro_batch_slices
from aikit.datasets import IGNORE, pad_batch, stdlib_text
from aikit.elastic.Torch import distributed
from aikit.ga.Torch.optim import Optimizer, UpdateScheduler


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads).unbind(2)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """A GPT over bytes: token and position embeddings, ``layers`` blocks, a linear head.
    Padding sits at the end of a sequence, so causal attention never lets it reach a real token."""

    def __init__(self, vocab: int = 256, context: int = 128, width: int = 128, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.context = context
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def token_loss(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The micro-batch's loss, the mean cross-entropy over its tokens whose label is not
    ignored, and their number: what ``accumulate(model, weight=...)`` takes (a 0-d tensor, left
    on the device). With no such token the mean is NaN; its weight 0 makes it add nothing."""
    logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
    return loss, (labels != IGNORE).sum()


def windows(sequences: int, global_batch: int, seed: int = 0) -> Iterator[np.ndarray]:
    """The sequence indices of every update, epoch after epoch: consecutive windows of
    ``global_batch`` in each epoch's seeded shuffle (the rest of an epoch, shorter than a
    window, waits for a later shuffle). The same on every process."""
    for epoch in range(sys.maxsize):
        order = np.random.default_rng([seed, epoch]).permutation(sequences)
        for start in range(0, sequences - global_batch + 1, global_batch):
            yield order[start:start + global_batch]


def update_micro_batches(sequences: list[np.ndarray], window: np.ndarray, plan: Plan, rank: int,
                         device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This process's ``(inputs, labels)`` in each GA step of one update's ``window``: its
    share by the plan, padded to its longest sequence (``aikit.datasets.pad_batch``); empty
    (0 sequences) where the plan gives it none in a step."""
    batches = []
    for piece in micro_batch_slices(plan, rank):
        chosen = [sequences[i] for i in window[piece]]
        inputs, labels = pad_batch(chosen) if chosen else (np.zeros((0, 1), np.int64), np.zeros((0, 1), np.int64))
        batches.append((torch.from_numpy(inputs).to(device), torch.from_numpy(labels).to(device)))
    return batches


@torch.no_grad()
def validation_loss(model: nn.Module, sequences: list[np.ndarray], batch_size: int, device: torch.device,
                    autocast: bool = False) -> float:
    """The mean loss over every token of ``sequences`` (nats per byte), the batches dealt over
    the processes (each runs as many forwards: FSDP2 gathers its parameters in each)."""
    world, rank = distributed.world_size(), distributed.rank()
    starts = list(range(0, len(sequences), batch_size))
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, tokens
    model.eval()
    for index in range(rank, math.ceil(len(starts) / world) * world, world):
        chosen = sequences[starts[index]:starts[index] + batch_size] if index < len(starts) else []
        inputs, labels = pad_batch(chosen) if chosen else (np.zeros((0, 1), np.int64), np.zeros((0, 1), np.int64))
        inputs, labels = torch.from_numpy(inputs).to(device), torch.from_numpy(labels).to(device)
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            logits = model(inputs)
        losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE,
                                 reduction="sum")
        totals += torch.stack([losses.double(), (labels != IGNORE).sum().double()])
    model.train()
    if world > 1:
        dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def shard(model: TinyGPT, bf16: bool) -> TinyGPT:
    """FSDP2: each block, then the rest at the root; bf16 compute with float32 reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # FSDP2 warns that the root returns a view (F.linear's logits over 3-d inputs are one): the
    # warning is about in-place changes to the output, which nothing here makes
    warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def warmup_cosine(warmup: int, total: int):
    """The LR factor of each update: a linear warmup, then a cosine decay to 10 %."""
    def factor(update: int) -> float:
        if update < warmup:
            return (update + 1) / warmup
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--global-batch-size", type=int, default=32, help="sequences per update")
    parser.add_argument("--max-device-batch", type=int, default=8, help="most sequences per device and GA step")
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--context", type=int, default=128, help="longest sequence, in bytes")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=30, help="updates of linear LR warmup")
    parser.add_argument("--max-bytes", type=int, default=None, help="read this much of the standard library")
    parser.add_argument("--val-sequences", type=int, default=1024, help="validation sequences to score")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--bf16", action="store_true", help="autocast to bfloat16, accumulate in float32")
    parser.add_argument("--target", type=float, default=2.3, help="exit 1 when the validation loss is above this")
    parser.add_argument("--quick", action="store_true", help="a few updates of a small model (the wheel test)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per process (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.updates, args.width, args.layers, args.context = 8, 32, 1, 64
        args.max_bytes, args.val_sequences, args.log_every, args.warmup, args.target = 300_000, 64, 4, 2, math.inf

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    multi_process = "WORLD_SIZE" in os.environ
    if multi_process and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{distributed.local_rank()}" if cuda else "cpu")
    plan = aikit.elastic.Torch.init(args.global_batch_size, args.max_device_batch)
    rank, master = distributed.rank(), aikit.elastic.Torch.master
    if master:
        print(aikit.elastic.Torch.summary(), flush=True)

    train, val = stdlib_text(max_len=args.context, max_bytes=args.max_bytes)
    val = val[:args.val_sequences]
    torch.manual_seed(args.seed)  # the same initial weights on every process
    model = TinyGPT(context=args.context, width=args.width, layers=args.layers, heads=args.heads).to(device)
    if master:
        params = sum(p.numel() for p in model.parameters())
        print(f"TinyGPT: {params:,} parameters; {len(train):,} training sequences, {len(val):,} validation",
              flush=True)
    if multi_process:
        model = shard(model, args.bf16)
    adamw = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    optimizer = Optimizer(adamw, plan.steps, max_grad_norm=1.0)
    scheduler = UpdateScheduler(torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup,
                                                                                          args.updates)))
    autocast = args.bf16 and not multi_process  # FSDP2 casts by its policy

    logged = torch.zeros(2, dtype=torch.float64, device=device)  # loss x tokens, tokens since the last log
    tokens_seen, start = 0, time.perf_counter()
    for update, window in zip(range(args.updates), windows(len(train), args.global_batch_size, args.seed),
                              strict=False):
        for inputs, labels in update_micro_batches(train, window, plan, rank, device):
            with optimizer.accumulate(model, weight=(labels != IGNORE).sum()):
                with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
                    loss, tokens = token_loss(model, inputs, labels)
                loss.backward()
            optimizer.step()
            logged += torch.stack([torch.nan_to_num(loss.detach().double()) * tokens, tokens.double()])
        scheduler.step()
        tokens_seen += sum(len(train[i]) - 1 for i in window)
        if (update + 1) % args.log_every == 0 or update + 1 == args.updates:
            if multi_process:
                dist.all_reduce(logged)
            elapsed = time.perf_counter() - start
            if master:
                print(f"update {update + 1}/{args.updates}: train loss {(logged[0] / logged[1]).item():.3f}, "
                      f"{tokens_seen / elapsed:,.0f} tokens/s", flush=True)
            logged.zero_()
    elapsed = time.perf_counter() - start
    loss = validation_loss(model, val, args.max_device_batch * 4, device, autocast)
    if master:
        print(f"trained on {tokens_seen:,} tokens in {elapsed:.1f} s ({tokens_seen / elapsed:,.0f} tokens/s); "
              f"validation loss {loss:.3f} nats per byte", flush=True)
    if multi_process:
        dist.destroy_process_group()
    if not loss <= args.target:
        sys.exit(f"validation loss {loss:.3f} is above the target {args.target}")
    return loss


if __name__ == "__main__":
    main()
