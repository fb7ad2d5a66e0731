"""The PyTorch runtime under aikit's adapters: process and engine detection
(:mod:`~aikit.runtime.Torch.distributed`), collectives, RNG snapshots, torch_xla SPMD, the GA
engine (:mod:`~aikit.runtime.Torch.wrapping`, :mod:`~aikit.runtime.Torch.accumulator`,
:mod:`~aikit.runtime.Torch.buckets`), per-micro-batch gradient norms, state checks and
gradient sync.

Importing this package loads torch and nothing of aikit: each adapter imports the modules it
uses (``import aikit.autolrs.Torch`` loads the collectives and RNG snapshots, not the GA engine).
"""

from aikit.optional import torch  # noqa: F401  (first: a missing torch names its extra)
