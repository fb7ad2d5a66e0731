"""GPU ratios side by side: aikit's GA against the loops people write by hand, on one device.

Every pair trains the same model (same weights, data and fused AdamW) one update at a time, the
variants interleaved in a shuffled order every round, and the script prints the median time per
update and the ratio aikit / other:

* **GA wrapper / hand-written accumulation loop** (``(loss / k).backward()``, step and zero every k
  micro-batches), the seed's recipe (``loss.backward(); optimizer.step()``): on a stack of
  transformer layers that fills the GPU (bf16 autocast; goal <= 1.01) and on a small MLP whose
  micro-steps are bound by kernel launches (goal <= 1.05);
* **token-weighted GA / the torchtune-style loop** (each mean loss times its token count, the
  counts summed on the device, one multiply by 1 / total before the step);
* **GA over k micro-batches / one big batch** of the same samples (tokens per second), where the
  big batch fits in memory;
* **bf16 autocast / fp32** (TF32 off), the same GA update;
* and whether the token-weighted GA's micro-steps wait for the GPU
  (``torch.cuda.set_sync_debug_mode("error")`` around them; goal: no host sync).

On CUDA the times are CUDA events; on the CPU, ``time.perf_counter`` at tiny sizes (``--quick``),
which proves the harness and nothing about speed: there the goals are printed, not required.

    python benchmarks/gpu.py                         # a GPU: about a minute on an H100
    python benchmarks/gpu.py --quick                 # the CPU: seconds
    python benchmarks/gpu.py --json results.json     # the ratios and goals, for scripts/gpu_check.sh
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from aikit.datasets import IGNORE
from aikit.ga.Torch.optim import Optimizer


@dataclass(frozen=True)
class Sizes:
    width: int  # the transformer's model width (heads of 128)
    layers: int
    context: int  # tokens per sequence
    sequences: int  # sequences per micro-batch
    steps: int  # micro-batches per update
    vocab: int
    mlp_width: int  # the launch-bound MLP
    mlp_batch: int
    mlp_steps: int
    rounds: int
    mlp_rounds: int


SIZES = {
    "gpu": Sizes(width=2048, layers=4, context=1024, sequences=8, steps=4, vocab=4096,
                 mlp_width=256, mlp_batch=32, mlp_steps=8, rounds=12, mlp_rounds=60),
    "quick": Sizes(width=32, layers=1, context=16, sequences=2, steps=4, vocab=16,
                   mlp_width=16, mlp_batch=8, mlp_steps=4, rounds=3, mlp_rounds=5),
}
GOALS = {"GA / hand, transformer block": 1.01, "GA / hand, launch-bound MLP": 1.05}


class Transformer(nn.Module):
    """Pre-norm transformer layers over float inputs and a token head: a language model's body."""

    def __init__(self, s: Sizes):
        super().__init__()
        layer = nn.TransformerEncoderLayer(s.width, max(1, s.width // 128), 4 * s.width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, s.layers, enable_nested_tensor=False)
        self.head = nn.Linear(s.width, s.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def launch_bound(s: Sizes) -> nn.Module:
    blocks = [m for _ in range(4) for m in (nn.Linear(s.mlp_width, s.mlp_width), nn.LayerNorm(s.mlp_width), nn.GELU())]
    return nn.Sequential(*blocks, nn.Linear(s.mlp_width, s.vocab))


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over the tokens not ``IGNORE``d, from ops that never read the device."""
    logp = torch.log_softmax(logits.float(), -1)
    kept = labels != IGNORE
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * kept).sum() / kept.sum()


def token_batches(s: Sizes, device: torch.device, width: int, sequence: int) -> list[tuple[torch.Tensor, ...]]:
    """``s.steps`` micro-batches of inputs and labels, a different share of each one's labels ignored."""
    gen = torch.Generator().manual_seed(0)
    batches = []
    for index in range(s.steps):
        x = torch.randn(s.sequences, sequence, width, generator=gen)
        labels = torch.randint(0, s.vocab, (s.sequences, sequence), generator=gen)
        labels[:, sequence * (index + 1) // (s.steps + 1):] = IGNORE
        batches.append((x.to(device), labels.to(device)))
    return batches


def classification_batches(s: Sizes, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """The launch-bound MLP's ``s.mlp_steps`` micro-batches of ``s.mlp_batch`` samples."""
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(s.mlp_batch, s.mlp_width, generator=gen).to(device),
             torch.randint(0, s.vocab, (s.mlp_batch,), generator=gen).to(device)) for _ in range(s.mlp_steps)]


# --- the loops ----------------------------------------------------------------------------------
def hand_written(model, optimizer, batches, autocast) -> None:
    for x, labels in batches:
        with autocast():
            loss = token_loss(model(x), labels)
        (loss / len(batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def aikit_ga(model, optimizer, batches, autocast) -> None:
    for x, labels in batches:
        with autocast():
            loss = token_loss(model(x), labels)
        loss.backward()
        optimizer.step()


def torchtune_style(model, optimizer, batches, autocast) -> None:
    total = 0
    for x, labels in batches:
        tokens = (labels != IGNORE).sum()
        with autocast():
            loss = token_loss(model(x), labels)
        (loss * tokens).backward()
        total = total + tokens
    torch._foreach_mul_([p.grad for p in model.parameters() if p.grad is not None], 1 / total)
    optimizer.step()
    optimizer.zero_grad()


def aikit_tokens(model, optimizer, batches, autocast) -> None:
    for x, labels in batches:
        with optimizer.accumulate(model, weight=(labels != IGNORE).sum()):
            with autocast():
                loss = token_loss(model(x), labels)
            loss.backward()
        optimizer.step()


def big_batch(model, optimizer, batches, autocast) -> None:
    x, labels = (torch.cat(parts) for parts in zip(*batches, strict=True))
    with autocast():
        loss = token_loss(model(x), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


# --- timing -------------------------------------------------------------------------------------
def variant(make: Callable[[], nn.Module], loop, batches, device, autocast, ga: bool):
    """One update of ``loop`` on its own model and fused AdamW (the GA wrapper around it with ``ga``)."""
    torch.manual_seed(0)
    with device:  # made on the device: a CPU init of the GPU-sized model would take seconds
        model = make()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    optimizer = Optimizer(inner, len(batches)) if ga else inner
    return lambda: loop(model, optimizer, batches, autocast)


def measure(variants: dict[str, Callable[[], None]], rounds: int, device: torch.device) -> dict[str, float]:
    """Median seconds per update of each variant: CUDA events on a GPU, perf_counter elsewhere."""
    for run in variants.values():  # warm-up: kernels chosen, optimizer state allocated
        run()
        run()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        marks = []
        for name in random.sample(list(variants), len(variants)):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                variants[name]()
                end.record()
                marks.append((name, start, end))
            else:
                began = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - began)
        synchronize(device)
        for name, start, end in marks:
            times[name].append(start.elapsed_time(end) / 1e3)
    return {name: statistics.median(measured) for name, measured in times.items()}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def release(device: torch.device) -> None:
    """Free the last comparison's models before the next one allocates its own."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def autocast_to(device: torch.device, dtype: torch.dtype | None) -> Callable[[], contextlib.AbstractContextManager]:
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype)


@contextlib.contextmanager
def no_host_sync(device: torch.device) -> Iterator[None]:
    """Raise at the first operation that waits for the GPU (CUDA only)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def host_syncs_in_micro_steps(s: Sizes, device: torch.device) -> str:
    """'none' when one token-weighted GA update's micro-steps run under
    ``set_sync_debug_mode("error")`` without error, else the error; off CUDA the update runs
    without the check ('n/a')."""
    cuda = device.type == "cuda"
    batches = token_batches(s, device, s.mlp_width, 8)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(s.mlp_width, s.mlp_width), nn.GELU(), nn.Linear(s.mlp_width, s.vocab)).to(device)
    optimizer = Optimizer(torch.optim.AdamW(model.parameters(), fused=cuda), len(batches), max_grad_norm=1.0)
    counts = [(labels != IGNORE).sum() for _, labels in batches]
    synchronize(device)
    try:
        for index, ((x, labels), count) in enumerate(zip(batches, counts, strict=True)):
            with no_host_sync(device), optimizer.accumulate(model, weight=count):
                token_loss(model(x), labels).backward()
            if index < len(batches) - 1:
                optimizer.step()
    except RuntimeError as error:
        return f"sync: {str(error).splitlines()[0]}"
    optimizer.step()
    assert optimizer.updated
    return "none" if cuda else "n/a"


# --- the comparisons ----------------------------------------------------------------------------
def pair(name: str, make, batches, aikit: tuple, other: tuple, rounds: int, device: torch.device,
         tokens: int | None = None, detail: str = "") -> dict:
    """Time ``aikit`` against ``other`` (each ``(label, loop, ga, autocast)``) on models from
    ``make``; print both and return the row of their ratio (None where ``other`` ran out of memory)."""
    labels = aikit[0], other[0]
    try:
        seconds = measure({label: variant(make, loop, batches, device, autocast, ga)
                           for label, loop, ga, autocast in (aikit, other)}, rounds, device)
    except torch.OutOfMemoryError:
        print("  does not fit in memory")
        return {"name": name, "ratio": None, "detail": "does not fit"}
    except Exception as error:  # the other comparisons still run; the row says what failed
        traceback.print_exc()
        return {"name": name, "ratio": None, "detail": "error", "error": f"{type(error).__name__}: {error}"}
    finally:
        release(device)
    ratio = seconds[labels[0]] / seconds[labels[1]]
    row = {"name": name, "ratio": ratio, "seconds": seconds, "detail": detail}
    for label in labels:
        rate = f"  {tokens / seconds[label]:12,.0f} tokens/s" if tokens else ""
        print(f"  {label:<24} {seconds[label] * 1e3:9.3f} ms/update{rate}")
    if tokens:
        row["tokens_per_s"] = {label: tokens / seconds[label] for label in labels}
    print(f"  ratio {ratio:.3f}")
    if name in GOALS:
        row.update(goal=GOALS[name], met=ratio <= GOALS[name])
    return row


def compare(s: Sizes, device: torch.device) -> list[dict]:
    def transformer() -> nn.Module:
        return Transformer(s)

    batches = token_batches(s, device, s.width, s.context)
    tokens = s.steps * s.sequences * s.context
    with torch.device("meta"):
        params = sum(p.numel() for p in Transformer(s).parameters())
    bf16, fp32 = autocast_to(device, torch.bfloat16), autocast_to(device, None)
    shape = (f"{s.layers} layers of width {s.width} ({params / 1e6:.1f} M parameters), {s.steps} micro-batches of "
             f"{s.sequences} x {s.context} tokens")
    rows = []
    print(f"transformer block: {shape}, bf16 autocast")
    rows.append(pair("GA / hand, transformer block", transformer, batches, ("GA wrapper", aikit_ga, True, bf16),
                     ("hand-written", hand_written, False, bf16), s.rounds, device, tokens, shape))
    print("token-weighted GA (accumulate(model, weight=tokens)) against the torchtune-style loop")
    rows.append(pair("token GA / torchtune-style", transformer, batches, ("aikit weight=", aikit_tokens, True, bf16),
                     ("torchtune-style", torchtune_style, False, bf16), s.rounds, device, tokens, shape))
    print(f"GA over {s.steps} micro-batches against one big batch of the same {tokens:,} tokens")
    rows.append(pair(f"GA over {s.steps} / one big batch", transformer, batches, ("GA wrapper", aikit_ga, True, bf16),
                     ("one big batch", big_batch, False, bf16), s.rounds, device, tokens, shape))
    print("the GA update in bf16 autocast against fp32 (TF32 off)")
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        rows.append(pair("bf16 / fp32, GA update", transformer, batches, ("bf16 autocast", aikit_ga, True, bf16),
                         ("fp32", aikit_ga, True, fp32), max(3, s.rounds // 2), device, tokens, shape))
    finally:
        torch.set_float32_matmul_precision(precision)
    mlp = f"4 layers of width {s.mlp_width}, {s.mlp_steps} micro-batches of {s.mlp_batch}"
    print(f"launch-bound MLP: {mlp}, fp32")
    rows.append(pair("GA / hand, launch-bound MLP", lambda: launch_bound(s), classification_batches(s, device),
                     ("GA wrapper", aikit_ga, True, fp32), ("hand-written", hand_written, False, fp32),
                     s.mlp_rounds, device, detail=mlp))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few rounds: proves the harness (CPU)")
    parser.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the ratios and goals here")
    args = parser.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    s = SIZES["quick" if args.quick or device.type != "cuda" else "gpu"]
    if args.rounds:
        s = replace(s, rounds=args.rounds, mlp_rounds=5 * args.rounds)
    random.seed(0)
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread: the tiny sizes time Python, as ga_torch.py does
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (timings prove the harness only)"
    clock = "CUDA events" if device.type == "cuda" else "perf_counter"
    print(f"{name}, torch {torch.__version__}, {clock}, median of {s.rounds} rounds ({s.mlp_rounds} for the MLP)")
    rows = compare(s, device)
    syncs = host_syncs_in_micro_steps(s, device)
    rows.append({"name": "host syncs in token GA micro-steps", "value": syncs,
                 **({"goal": "none", "met": syncs == "none"} if device.type == "cuda" else {})})
    print("\nratios (aikit / other)" + ("" if device.type == "cuda" else ": CPU timings, goals not required"))
    for row in rows:
        figure = row.get("value") or (row["detail"] if row.get("ratio") is None else f"{row['ratio']:.3f}")
        goal = row.get("goal", GOALS.get(row["name"]))
        verdict = "" if goal is None else f"goal {'<= ' if isinstance(goal, float) else ''}{goal}: " + (
            "n/a" if "met" not in row else "PASS" if row["met"] else "MISS")
        print(f"  {row['name']:<40} {figure:>10}  {verdict}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": name, "torch": torch.__version__, "goals_required": device.type == "cuda",
                       "sizes": asdict(s), "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
