"""The critical batch, measured by branching rather than guessed from the gradient noise.

Merrill et al. ("Critical Batch Size Revisited", 2025) found that the simple noise scale
``tr(Σ)/|G|²`` underestimates the critical batch and does not even follow its trend; they
*measure* it: from a checkpoint, train ``k·B`` at the LR a rule gives for a short window and
check whether the loss recovers to the base run's. This package does that while training, and
acts on it; framework-free (numpy), the adapters supply the training:

* :mod:`~aikit.core.critical_batch.probe`: one probe (:class:`CriticalBatchProbe` over the
  adapter's :class:`Branches`): branch, train, compare, roll back; its samples and CPU time.
* :mod:`~aikit.core.critical_batch.policy`: when to probe and what to do with the answer
  (:class:`ProbePolicy`: probes geometric in samples, growth by integer factors, the LR the
  probe chose), its trace and state.
* :mod:`~aikit.core.critical_batch.controller`: the policy as the adaptive run's controller
  (:class:`ProbeController`, a :class:`~aikit.core.goodput.GoodputController` that still
  measures the noise, as a diagnostic), so PyTorch's ``AdaptiveSampler``/``AdaptiveOptimizer``
  pack, replay and resume it as they do the goodput controller's run.
"""

from __future__ import annotations

from aikit.core.critical_batch.controller import PROBED_NOISE_EVERY, ProbeController
from aikit.core.critical_batch.policy import ProbePolicy
from aikit.core.critical_batch.probe import Branches, CriticalBatchProbe, ProbeResult

__all__ = ["PROBED_NOISE_EVERY", "Branches", "CriticalBatchProbe", "ProbeController", "ProbePolicy", "ProbeResult"]
