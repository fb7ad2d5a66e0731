"""Mutation audit of the GA engine, its core arithmetic, AutoLRS's controller and the adaptive hold: do the tests
catch realistic bugs?

Each mutant is one named, realistic bug planted as a text patch in one file; the fast tests
about that code run against it (``pytest -x -q``), and the mutant is *caught* when they fail.
The file is put back after every mutant, whatever happens. Prints one line per mutant and the
score; exits non-zero if a mutant survives or a patch no longer applies.

    .venv/bin/python scripts/mutation_audit.py            # all mutants (about 15 minutes on 2 cores)
    .venv/bin/python scripts/mutation_audit.py amp clip   # only those whose name contains a word
    .venv/bin/python scripts/mutation_audit.py --check    # only whether every patch still applies (a test runs it)
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GA_TESTS = "tests/torch/test_ga_optimizer.py"
CORE_TESTS = "tests/core/test_ga.py tests/core/test_plan.py"
TRACE_TESTS = "tests/trace/test_trace_optim.py"
REDUCE_TESTS = "tests/torch/test_reduce_at_update.py"
RESIZE_TESTS = "tests/resize/test_resize_state.py"
KERAS_TESTS = "tests/tf/test_keras_ga_optimizer.py"
RUNAI_TESTS = "tests/torch/test_ga_prebuilt.py tests/torch/test_runai_ga_torch.py"
KERAS_BACKEND_TESTS = "tests/test_keras_backends.py -k jax"  # tests/keras in a process on JAX
KERAS_RUNAI_TESTS = "tests/tf/test_keras_ga_prebuilt.py tests/tf/test_runai_ga_keras.py"
HOROVOD_TESTS = "tests/horovod/test_horovod_ga.py"
HOROVOD_SINGLE = "tests/horovod/test_horovod_single.py"
ELASTIC_TESTS = "tests/horovod/test_horovod_elastic_ga.py"
TOKEN_TESTS = "tests/lm/test_token_weights.py"
TOKEN_ENGINE_TESTS = "tests/lm/test_lm_engines.py -k two_torchrun"
AUTOLRS_TESTS = "tests/autolrs/test_autolrs_core.py"
ADAPTER_TESTS = "tests/keras/test_autolrs_adapters.py"  # the Keras callback against the torch hook
ADAPTIVE_TESTS = "tests/core/test_adaptive_core.py"
GOODPUT_TESTS = "tests/core/test_goodput.py"
RESTORE_TESTS = "tests/resize/test_restore_checks.py"
ENGINE_TESTS = "tests/torch/test_engines.py"
RAY_STATE_TESTS = "tests/ray/test_ray_state.py"
RAY_TESTS = "tests/ray/test_ray_fixed.py"
SKIP_TESTS = "tests/torch/test_skipped_updates.py"
AUTO_TESTS = "tests/core/test_device_batch.py tests/torch/test_auto_batch.py"
ACCELERATE_TESTS = "tests/integrations/test_accelerate.py"
TRAINER_TESTS = "tests/integrations/test_huggingface.py -k global_batch"
TRAINER_RETRY_TESTS = "tests/integrations/test_huggingface.py -k starts_over"
TORCHFT_INPUTS = "tests/torchft/test_torchft_inputs.py"
TORCHFT_GROUPS = "tests/torchft/test_replica_groups.py"

# (name, file, original text, planted text, tests that must catch it)
MUTANTS = [
    ("core: world scaling dropped", "aikit/core/ga.py",
     "return unit * averaging_replicas / total_weight", "return unit / total_weight", CORE_TESTS),
    ("core: common size is the largest, not the most frequent", "aikit/core/ga.py",
     "return max(base + (2 * extra > parts), 1)", "return max(base + (extra > 0), 1)", CORE_TESTS),
    ("core: short window factor inverted", "aikit/core/ga.py",
     "return planned / seen", "return seen / planned", CORE_TESTS),
    ("core: equal weight off by one", "aikit/core/ga.py",
     "return micro_steps if num_replicas == 1 else", "return micro_steps + 1 if num_replicas == 1 else", CORE_TESTS),
    ("core: the sum divides by the micro-steps", "aikit/core/ga.py",
     "    if reduction_name(reduction) == \"sum\":\n        return 1\n",
     "    if reduction_name(reduction) == \"sum\":\n        return micro_steps\n", CORE_TESTS),
    # issue 47: a ragged plan fed equal, undeclared micro-steps (init(256, "auto") -> 86) trained 258 per update
    ("core: a ragged plan's undeclared micro-steps weighed as its update", "aikit/core/plan.py",
     "    if plan is None or plan.is_even or micro_steps != plan.micro_steps",
     "    if True or plan is None or plan.is_even or micro_steps != plan.micro_steps",
     "tests/torch/test_auto_batch.py -k ragged_plan_found"),
    ("engine: clipping before AMP unscaling", "aikit/runtime/Torch/accumulator.py",
     "        if amp.enabled(self.scaler):\n            self.scaler.unscale_(",
     "        if self.max_grad_norm is not None:\n"
     "            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)\n"
     "        if amp.enabled(self.scaler):\n            self.scaler.unscale_(", GA_TESTS),
    ("engine: a successful AMP update reported as skipped", "aikit/runtime/Torch/amp.py",
     "    stepped = not bool(unscaled)  # the one read\n", "    stepped = not bool(unscaled.sum() + 1)\n",
     GA_TESTS),
    ("engine: folded factor forgotten at the update", "aikit/runtime/Torch/accumulator.py",
     "scale, self.carried = scale * self.carried, 1.0", "scale, self.carried = scale, 1.0", GA_TESTS),
    ("engine: folded rescale inverted", "aikit/runtime/Torch/accumulator.py",
     "self._rescale(self.carried / factor)", "self._rescale(factor / self.carried)", GA_TESTS),
    ("engine: empty micro-batch scaled, not dropped", "aikit/runtime/Torch/accumulator.py",
     "return torch.zeros_like(grad) if self.factor == 0 else grad * self.factor", "return grad * self.factor",
     GA_TESTS),
    ("engine: gradients kept after the update", "aikit/runtime/Torch/accumulator.py",
     "                self.outcomes.flag(found)\n        self.optimizer.zero_grad()\n",
     "                self.outcomes.flag(found)\n", GA_TESTS),
    ("engine: weight applied after clipping", "aikit/runtime/Torch/accumulator.py",
     "not read\n            mul_(grads, scale)\n", "not read\n            pass\n", GA_TESTS),
    ("engine: replicas' folded factors summed as they are", "aikit/runtime/Torch/accumulator.py",
     "        if self.carried != 1:  # each replica folded its own factor: unfold it before summing\n"
     "            self._rescale(self.carried)\n            self.carried = 1.0\n", "", REDUCE_TESTS),
    ("engine: untouched parameters get a zero gradient", "aikit/runtime/Torch/accumulator.py",
     "p.grad = grad if used else None", "p.grad = grad", REDUCE_TESTS),
    ("optim: reduce forgets to average over ranks", "aikit/ga/Torch/window.py",
     "equal_share(self.micro_step, reduction, num_replicas,", "equal_share(self.micro_step, reduction, 1,",
     REDUCE_TESTS),
    ("optim: reduce scales sample weights by the world", "aikit/ga/Torch/window.py",
     "scale = sample_share(self.unit, total, averaging)", "scale = sample_share(self.unit, total, num_replicas)",
     REDUCE_TESTS),
    ("optim: short window not corrected", "aikit/ga/Torch/window.py",
     "            scale *= short_window_factor(total, samples)", "            pass", GA_TESTS),
    ("optim: divisor is steps, not micro-steps accumulated", "aikit/ga/Torch/optim.py",
     "        window, self.window = self.window, Window(self.engine)\n",
     "        window, self.window = self.window, Window(self.engine)\n        window.micro_step = self._micro_steps\n",
     GA_TESTS),
    ("optim: micro_steps not counted", "aikit/ga/Torch/optim.py",
     "        self.micro_steps_taken += 1\n        return loss", "        return loss", RUNAI_TESTS),
    ("optim: a checkpoint of the other reduction loads", "aikit/ga/Torch/state.py",
     "    if ga[\"reduction\"] != reduction:", "    if False:", RUNAI_TESTS),
    ("optim: the prebuilt optimizers give the wrapper's keywords to torch", "aikit/ga/Torch/runai.py",
     "options = {name: kwargs.pop(name) for name in wrapper_keywords if name in kwargs}", "options = {}",
     RUNAI_TESTS),
    ("optim: update always reported", "aikit/ga/Torch/optim.py",
     "self.updated = self._update(short=False)", "self._update(short=False)", GA_TESTS),
    ("optim: pending gradient shapes not checked", "aikit/ga/Torch/state.py",
     "    if micro_step:\n        check_pending(", "    if False:\n        check_pending(", GA_TESTS),
    ("optim: UpdateScheduler steps every call", "aikit/ga/Torch/scheduler.py",
     "        for _ in range(applied - self._seen):\n            self.scheduler.step(*args, **kwargs)",
     "        self.scheduler.step(*args, **kwargs)", GA_TESTS),
    ("optim: UpdateScheduler steps once for several updates", "aikit/ga/Torch/scheduler.py",
     "for _ in range(applied - self._seen):", "for _ in range(min(applied - self._seen, 1)):",
     "tests/resize/test_restore_order.py"),
    ("trace: step weight not applied", "aikit/elastic/Torch/trace_optim.py",
     "        return self.epoch_schedule.share(self.step_index)", "        return 1.0", TRACE_TESTS),
    ("trace: base LR not restored", "aikit/runtime/Torch/wrapping.py",
     "            group.update(values)", "            pass", TRACE_TESTS),
    ("trace: set_epoch restarts a resumed epoch", "aikit/elastic/Torch/trace_optim.py",
     "if not (self._untouched and epoch == self.epoch):", "if True:", TRACE_TESTS),
    ("trace: load forgets the sampler position", "aikit/elastic/Torch/trace_state.py",
     "    optimizer.sampler.resume(trace[\"epoch\"], trace[\"step\"], trace[\"micro\"])\n", "", TRACE_TESTS),
    ("trace: clipping dropped", "aikit/elastic/Torch/trace_optim.py",
     "self.engine = Accumulator(optimizer, max_grad_norm=max_grad_norm, scaler=scaler,",
     "self.engine = Accumulator(optimizer, scaler=scaler,", TRACE_TESTS),
    ("resize: objects not checked before loading", "aikit/elastic/Torch/resize.py",
     "            check_commit(payload, self._objects, self.optimizer, self.directory,  # everything, before "
     "anything changes\n                         self._expected_global_batch())\n", "", RESIZE_TESTS),
    ("resize: unchecked objects not put back", "aikit/elastic/Torch/loading.py",
     "        for name, state in before.items():\n            objects[name].load_state_dict(state)\n",
     "", RESIZE_TESTS + " -k 'failed_restore or puts_back'"),
    ("keras: divides by steps, not micro-steps accumulated", "aikit/keras/optimizers.py",
     "accumulated_divisor(self._accumulated + 1,", "accumulated_divisor(self._micro_steps,", KERAS_TESTS),
    ("keras: the sum switch ignored", "aikit/keras/optimizers.py",
     "accumulated_divisor(self._accumulated + 1, self.reduction)",
     "accumulated_divisor(self._accumulated + 1, \"mean\")", KERAS_RUNAI_TESTS),
    ("keras: load_weights overwrites steps", "aikit/keras/saved.py",
     "    optimizer._micro_steps.assign(steps)\n\n\ndef save_variables", "\n\ndef save_variables",
     KERAS_TESTS),
    ("keras: the JAX step's branches keep only the model's variables (the optimizer's state not carried)",
     "aikit/keras/optimizers.py", "        return [*self._trainable_variables, *self.variables]",
     "        return [*self._trainable_variables]", KERAS_BACKEND_TESTS),
    ("keras: an update on every micro-step", "aikit/runtime/Keras/jax.py",
     "    return accumulated + 1 >= micro_steps", "    return accumulated + 1 >= 1", KERAS_BACKEND_TESTS),
    ("keras: a summed loss's reduction not taken (its updates 1/steps of the big batch's)", "aikit/keras/optimizers.py",
     "            self.reduction = compiled_reduction(model) or self.reduction",
     "            self.reduction = self.reduction", "tests/keras/test_ga_backends.py -k summed"),
    ("keras: torch's update applies the sum, the in-place division skipped", "aikit/runtime/Keras/torch.py",
     "        torch._foreach_div_(tensors, divisor)", "        pass",
     "tests/test_keras_backends.py -k 'tests_pass and torch'"),
    # the overlapped all-reduce (engine.Buckets), under torchrun and horovodrun
    ("overlap: a bucket started before its last gradient", "aikit/runtime/Torch/buckets.py",
     "and not self.waiting[len(self.started)]:",
     "and len(self.waiting[len(self.started)]) < len(self.buckets[len(self.started)]):", REDUCE_TESTS),
    ("overlap: no bucket waited for", "aikit/runtime/Torch/buckets.py",
     "            for _, wait in self.started:\n                wait()", "", REDUCE_TESTS + " " + HOROVOD_TESTS),
    ("overlap: the last bucket (with the flags) never waited for", "aikit/runtime/Torch/buckets.py",
     "            for _, wait in self.started:\n                wait()",
     "            for _, wait in self.started[:-1]:\n                wait()", REDUCE_TESTS + " " + HOROVOD_TESTS),
    ("overlap: a gradient grown after its bucket started is ignored", "aikit/runtime/Torch/buckets.py",
     "            self.late = True\n            return", "            return", REDUCE_TESTS),
    ("overlap: replicas' folded factors summed as they are", "aikit/runtime/Torch/buckets.py",
     "        if factor != 1:  # each replica folded its own factor: unfold it before summing\n"
     "            flat[", "        if False:\n            flat[", REDUCE_TESTS),
    ("overlap: untouched parameters get a zero gradient", "aikit/runtime/Torch/buckets.py",
     "p.grad = grad if has else None", "p.grad = grad", REDUCE_TESTS),
    ("overlap: armed in every micro-step, not only the last", "aikit/ga/Torch/optim.py",
     "        return self.sync_gradients\n", "        return True\n", REDUCE_TESTS),
    # token-weighted accumulation: accumulate(model, weight=n) (tests/lm)
    ("tokens: the mean of micro-batch means", "aikit/runtime/Torch/accumulator.py",
     "        weight = self.checked_terms(weight)\n", "        weight = self.checked_terms(weight) * 0 + 1\n",
     TOKEN_TESTS),
    ("tokens: the weight applied twice", "aikit/runtime/Torch/output_weights.py",
     "torch.where(factor != 0, grad * factor, 0)", "torch.where(factor != 0, grad * factor * factor, 0)",
     TOKEN_TESTS),
    ("tokens: the total counted per rank (DDP, FSDP2)", "aikit/ga/Torch/window.py",
     "    return engine.take_terms(summed=True)\n", "    return engine.take_terms()\n", TOKEN_ENGINE_TESTS),
    ("tokens: the count not summed with the gradients (reduce=True)", "aikit/ga/Torch/window.py",
     "        (total,) = engine.reduce([engine.take_terms()])\n",
     "        engine.reduce([])\n        total = engine.take_terms()\n", TOKEN_ENGINE_TESTS),
    ("elastic: TorchState uses Horovod's own optimizer handler", "aikit/runtime/Torch/engines/horovod.py",
     "state.set_handler_registry([(kind, _WholeState), *registry])",
     "state.set_handler_registry([*registry, (kind, _WholeState)])", HOROVOD_SINGLE),
    ("elastic: a joining worker keeps its own optimizer state", "aikit/runtime/Torch/engines/horovod.py",
     "        if HOROVOD.world_size() > 1:\n            self.value.load_state_dict(", "        if False:\n"
     "            self.value.load_state_dict(", ELASTIC_TESTS),
    ("autolrs: the ramp starts at zero and ends a step early", "aikit/core/autolrs/range_test.py",
     "return lr * (since + 1) / (ramp_steps + 1)", "return lr * since / ramp_steps", AUTOLRS_TESTS),
    ("autolrs: a slow net is rolled back again and again", "aikit/core/autolrs/controller.py",
     'and self.phase == "train" and not self.rollbacks', 'and self.phase == "train"', AUTOLRS_TESTS),
    ("autolrs: max_lr from the LR at the lowest loss", "aikit/core/lr_range/suggestions.py",
     "index = int(np.argmax(losses <= lowest + BOTTOM_NEAR * (losses[0] - lowest)))",
     "index = int(losses.argmin())", f"tests/lr_finder/test_lr_range.py {AUTOLRS_TESTS}"),
    ("autolrs: a short range test smoothed as a long one", "aikit/core/autolrs/range_test.py",
     "return LossTracker(min(0.5, RANGE_SMOOTHING / range_steps))", "return LossTracker(0.05)", AUTOLRS_TESTS),
    ("autolrs: the Keras callback hands on the epoch's running mean loss", "aikit/keras/autolrs.py",
     "self._driver.step((total - self._sums_before[0]) / (count - self._sums_before[1]))",
     "self._driver.step(total / count)", ADAPTER_TESTS + " -k same_losses"),
    ("autolrs: Keras' SGD velocity lags the LR the torch hook sets", "aikit/keras/autolrs.py",
     "    if before > 0 and lr != before and math.isfinite(lr):", "    if False:",
     ADAPTER_TESTS + " -k same_problem"),
    ("resize: a commit from before the trace optimizers moved is refused", "aikit/elastic/Torch/restore_checks.py",
     'return f"{MOVED_CLASSES.get(cls, cls)}{paren}{inner}" == now', "return saved == now", RESTORE_TESTS),
    ("lr policy: the decay read at the samples after the update", "aikit/elastic/Torch/trace_optim.py",
     "return self.sampler.schedule.trace.samples_before(self.epoch_schedule.first_step + self.step_index)",
     "return self.sampler.schedule.trace.samples_before(self.epoch_schedule.first_step + self.step_index + 1)",
     "tests/trace/test_seesaw.py tests/tf/test_one_lr_policy.py"),
    ("engines: torchrun's variables outrank an engine in use", "aikit/runtime/Torch/engines/__init__.py",
     "        if engine.in_use():\n            return engine\n",
     "        if engine.launched() or engine.in_use():\n            return engine\n", ENGINE_TESTS),
    # Ray Train's workers (aikit.integrations.ray), on a local Ray cluster
    ("ray: a worker that cannot see the directory passes the check", "aikit/integrations/ray.py",
     "        blind = [r for r, flag in enumerate(values[len(values) - world:]) if not flag]\n",
     "        blind = []\n", RAY_TESTS + " -k cannot_see"),
    ("ray: the workers' plans not compared", "aikit/integrations/ray.py",
     "        check_agreement(list(settings), rows_of(values[:len(values) - world], world))\n", "",
     RAY_TESTS + " -k different_plans"),
    ("ray: a commit of another global batch restored", "aikit/integrations/ray.py",
     "        return planned_global_batch()\n", "        return None\n", RAY_STATE_TESTS),
    ("ray: a run started from Ray's checkpoint commits into it", "aikit/integrations/ray.py",
     "            self.__dict__[\"directory\"] = directory\n", "            pass\n", RAY_STATE_TESTS),
    # Accelerate and the Hugging Face Trainer keeping the global batch (aikit.integrations.accelerate, .huggingface)
    ("accelerate: GA steps not set from the plan (observed // batch of the try itself: 1)",
     "aikit/integrations/accelerate.py", "        self.accelerator.gradient_accumulation_steps = plan.micro_steps\n",
     "        self.accelerator.gradient_accumulation_steps = max(1, self.device_batch // device_batch)\n",
     ACCELERATE_TESTS + " -k 'not two'"),
    ("accelerate: Accelerate's x0.9 back-off kept", "aikit/integrations/accelerate.py",
     "        smaller = smaller_plan(self.plan)\n",
     "        smaller = self._plan(max(1, int(self.plan.device_batch * 0.9)))\n", ACCELERATE_TESTS + " -k 'not two'"),
    ("accelerate: token counts not summed across processes", "aikit/integrations/accelerate.py",
     'total = self.accelerator.reduce(torch.stack(counts).sum(), "sum")',
     'total = torch.stack(counts).sum()', ACCELERATE_TESTS + " -k two"),
    ("accelerate: the loss not multiplied back by the GA steps", "aikit/integrations/accelerate.py",
     "        return loss_sum * (scale * self.steps)\n", "        return loss_sum * scale\n",
     ACCELERATE_TESTS + " -k 'not two'"),
    ("trainer: GA steps left as the arguments set them", "aikit/integrations/huggingface.py",
     "args.per_device_train_batch_size, args.gradient_accumulation_steps = plan.device_batch, plan.micro_steps",
     "args.per_device_train_batch_size = plan.device_batch", TRAINER_TESTS),
    ("trainer: a retry keeps the updates of the try that ran out of memory", "aikit/integrations/huggingface.py",
     "            before.put_back(trainer)\n", "", TRAINER_RETRY_TESTS),
    ("trainer: a retry keeps the Trainer-made optimizer's state", "aikit/integrations/huggingface.py",
     "            trainer.optimizer = None  # the Trainer makes a fresh one\n", "            pass\n",
     TRAINER_RETRY_TESTS),
    ("resize: a commit's global batch not recorded", "aikit/elastic/Torch/resize.py",
     "            \"global_batch_size\": planned_global_batch(),", "            \"global_batch_size\": None,",
     RAY_STATE_TESTS),
    ("adaptive: the hold starts an update late", "aikit/core/adaptive/packing.py",
     "self._decided_samples >= self.hold_after:", "self._decided_samples > self.hold_after:", ADAPTIVE_TESTS),
    ("adaptive: the next update's split is read before the hold", "aikit/core/adaptive/packing.py",
     "            self._hold_if_due()  # before the next update's split decides whether the epoch goes on\n", "",
     ADAPTIVE_TESTS),
    ("adaptive: a held run still decides", "aikit/core/adaptive/run.py",
     "new = None if self.schedule.held or not applied else controller.propose()", "new = controller.propose()",
     ADAPTIVE_TESTS),
    ("adaptive: a held update's noise is recorded", "aikit/core/adaptive/run.py",
     "            noise = None  # a held update measures nothing", "            pass  # a held update measures nothing",
     ADAPTIVE_TESTS),
    # an update whose gradient is inf or NaN: skipped as a GradScaler skips one (issue 40)
    ("skip: a non-finite gradient applied (the skip removed)", "aikit/runtime/Torch/accumulator.py",
     "            if self.skip_nonfinite and grads and not self._finite(grads, norm, checked):\n"
     "                return self.outcomes.record(False)\n", "", GA_TESTS),
    ("skip: a skipped update counted as an update", "aikit/runtime/Torch/accumulator.py",
     "                return self.outcomes.record(False)\n            self.optimizer.step()\n",
     "                pass\n            self.optimizer.step()\n", GA_TESTS),
    ("skip: a skipped trace update advances the warmup", "aikit/elastic/Torch/trace_optim.py",
     "            self.updates += self.updated\n", "            self.updates += 1\n", TRACE_TESTS),
    # an update AMP skipped advances nothing that counts updates, fused optimizers' too (issue 38)
    ("skip: a fused optimizer's skipped update advances the scheduler", "aikit/runtime/Torch/outcomes.py",
     "            self.applied += len(flags) - skipped\n", "            self.applied += len(flags)\n", SKIP_TESTS),
    ("skip: a fused skip read as applied by a trace optimizer", "aikit/elastic/Torch/trace_optim.py",
     "self.updated = self.engine.outcomes.settle() if stepped is None else stepped",
     "self.updated = True if stepped is None else stepped", SKIP_TESTS + " -k trace"),
    ("skip: aikit's inf/NaN flag not handed to a fused optimizer", "aikit/runtime/Torch/amp.py",
     "    optimizer.grad_scale, optimizer.found_inf = None, found\n",
     "    optimizer.grad_scale, optimizer.found_inf = None, None\n", SKIP_TESTS + " -k fused_optimizer"),
    ("skip: a fused optimizer's non-finite flags never read in a run", "aikit/runtime/Torch/outcomes.py",
     "        return len(self._unread) >= (MAX_UNREAD if limit is None else limit - self.skips.in_a_row)\n",
     "        return len(self._unread) >= MAX_UNREAD\n", SKIP_TESTS + " -k 'fused_optimizer or gradscaler'"),
    ("skip: a non-fused AMP skip stepped anyway", "aikit/runtime/Torch/amp.py",
     "    if stepped:\n        optimizer.step()\n", "    optimizer.step()\n", SKIP_TESTS),
    ("skip: AutoLRS counts a skipped update as a step of its search", "aikit/autolrs/Torch/autolrs.py",
     "        if update_skipped(self.optimizer):", "        if False:", SKIP_TESTS + " -k autolrs"),
    ("skip: the adaptive controller decides on a skipped update", "aikit/core/adaptive/run.py",
     "new = None if self.schedule.held or not applied else controller.propose()",
     "new = None if self.schedule.held else controller.propose()", SKIP_TESTS + " -k adaptive"),
    ("skip: the LR finder records a point for a skipped update", "aikit/runtime/Torch/amp.py",
     "    return not bool(flag) if stepped is None else stepped\n", "    return True\n", SKIP_TESTS + " -k lr_finder"),
    # the per-device batch found by running the user's step, the global batch kept (issue 38)
    ("auto: a re-plan keeps the old GA steps (the global batch shrinks)", "aikit/elastic/Torch/auto_batch.py",
     "        self.optimizer.steps = smaller.micro_steps\n", "", AUTO_TESTS),
    ("auto: an update that ran out of memory keeps its partial gradients", "aikit/elastic/Torch/auto_batch.py",
     "            self.optimizer.restart()\n", "", AUTO_TESTS),
    ("auto: the replicas run the largest any found", "aikit/core/device_batch.py",
     "    return None if any(f is None for f in found) else min(found)",
     "    return None if any(f is None for f in found) else max(found)", AUTO_TESTS),
    ("auto: each replica runs the size it found (no agreement)", "aikit/elastic/Torch/auto_batch.py",
     "    found = _agreed(search.found)\n", "    found = search.found\n", AUTO_TESTS + " -k replicas"),
    ("auto: the bisection stops one candidate short", "aikit/core/device_batch.py",
     "    while index - failed > 1:", "    while index - failed > 2:", AUTO_TESTS),
    ("skip: a run of skips fails one skip late", "aikit/core/skips.py",
     "and self.in_a_row >= self.max_in_a_row:", "and self.in_a_row > self.max_in_a_row:", GA_TESTS),
    ("skip: the Keras update applied whatever its gradient", "aikit/keras/skipping.py",
     "        if not self._checks_finite:\n            update()", "        if True:\n            update()",
     KERAS_TESTS),
    ("skip: each Horovod rank decides alone (Keras)", "aikit/keras/elastic/horovod.py",
     "        return hvd.allreduce(count, op=hvd.Sum) if hvd.size() > 1 else count\n", "        return count\n",
     "tests/horovod/test_horovod_tf.py"),
    ("skip: a micro-step without a backward not noticed", "aikit/runtime/Torch/backward_marks.py",
     "        if expect_backward and not _moved(self._last, marks):", "        if False:", GA_TESTS),
    # TorchFT's replica groups, every update's global batch kept (issue 44)
    ("torchft: every group takes the first group's share of a GA update", "aikit/elastic/Torch/update_sampler.py",
     "micro_batch_slices(plan, rank)]", "micro_batch_slices(plan, 0)]", TORCHFT_INPUTS + " -k update_sampler"),
    ("torchft: the groups' sum averaged, as TorchFT's allreduce does", "aikit/runtime/Torch/engines/torchft.py",
     "            self.manager.allreduce(flat, reduce_op=dist.ReduceOp.SUM).wait()",
     "            self.manager.allreduce(flat, reduce_op=dist.ReduceOp.AVG).wait()",
     TORCHFT_GROUPS + " -k middle_of_an_update"),
    ("torchft: the GA wrapper's buckets averaged over the groups", "aikit/runtime/Torch/engines/torchft.py",
     "        work = self.manager.allreduce(tensor, reduce_op=dist.ReduceOp.SUM)",
     "        work = self.manager.allreduce(tensor, reduce_op=dist.ReduceOp.AVG)", TORCHFT_GROUPS + " -k ga_wrapper"),
    ("torchft: an update retrained on its old deal after a group was lost", "aikit/elastic/Torch/update_loops.py",
     "        if (sampler.num_replicas, sampler.rank) != (num_replicas, rank):\n            sampler.set_world",
     "        if False:\n            sampler.set_world", TORCHFT_GROUPS + " -k middle_of_an_update"),
    # the adaptive run's hot path (its overhead measured in benchmarks/adaptive_overhead.py)
    ("goodput: an epoch's last update never split to measure the noise", "aikit/core/goodput.py",
     "least = 2 if splits_for_noise(update, self.noise_every, self.noise_until) else 1", "least = 1",
     GOODPUT_TESTS + " -k last_update"),
    ("goodput: the throughput model keeps every timing of the run", "aikit/core/goodput.py",
     "    return deque(seconds, maxlen=TIMINGS_KEPT)", "    return deque(seconds)",
     GOODPUT_TESTS + " -k latest_timings"),
]


def run(name: str, path: str, old: str, new: str, tests: str) -> bool | None:
    """True when the tests catch the mutant, False when it survives, None if it no longer applies.
    Only failing tests count as a catch (pytest's exit code 1): an error running them is raised."""
    file = ROOT / path
    original = file.read_text()
    if original.count(old) != 1:
        return None
    try:
        file.write_text(original.replace(old, new))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               *shlex.split(tests)],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"pytest could not run the tests for {name!r} (exit {done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.returncode == 1
    finally:
        file.write_text(original)


def stale_mutants() -> list[str]:
    """The mutants whose original text is not exactly once in their file (code moved or changed)."""
    return [name for name, path, old, _, _ in MUTANTS
            if not (ROOT / path).is_file() or (ROOT / path).read_text().count(old) != 1]


def main() -> int:
    words = sys.argv[1:]
    if words == ["--check"]:
        names = stale_mutants()
        for name in names:
            print(f"STALE {name}")
        return 1 if names else 0
    chosen = [m for m in MUTANTS if not words or any(w in m[0] for w in words)]
    caught = survived = stale = 0
    for mutant in chosen:
        start = time.monotonic()
        result = run(*mutant)
        verdict = {True: "caught", False: "SURVIVED", None: "STALE (patch does not apply)"}[result]
        caught += result is True
        survived += result is False
        stale += result is None
        print(f"{verdict:<10} {mutant[0]:<58} {time.monotonic() - start:5.1f} s", flush=True)
    print(f"mutation score: {caught}/{len(chosen)} caught ({survived} survived, {stale} stale)")
    return 0 if caught == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
