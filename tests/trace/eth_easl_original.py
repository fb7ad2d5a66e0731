"""eth-easl's variable batch size (variable_batch_size.py at 41c2c0c), re-implemented for the
tests from its source, without any of aikit's code: the reference aikit's compatible names must
reproduce bit for bit.

Kept as the original computes: the trace read with pandas' ``batchsize`` column in file order,
``torch.randperm`` from a generator seeded ``seed + epoch``, truncated to whole micro-batches,
``get_epoch_range``'s packing, ``get_batch_assignments``'s deal, the micro-batch ``b`` ->
``indices[b*mb:(b+1)*mb]`` mapping, the dummy batch ``[0]*mb`` for a rank without micro-batches,
and the optimizer's sum over ranks then scaling by ``1/divisor`` (``reduction='mean'``) or not
(``'sum'``), ``adapt_lr``, ``step``, ``zero_grad`` and putting the reference LR back.

Only torch_xla is replaced: ``xm.all_reduce(SUM, grads, scale)`` becomes the sum of the ranks'
gradients times ``scale``, the ranks run one after the other in this process, and a rank with no
micro-batch in a step contributes zeros (what the original does with torch < 2, where
``zero_grad()`` zeroed; with torch >= 2 it sets None and the original's all-reduce gets fewer
tensors on that rank).
"""

from __future__ import annotations

import pandas as pd
import torch


class OriginalSampler:
    def __init__(self, dataset_size, trace, seed=42, num_replicas=1, rank=0, minibatch_size=32):
        self.dataset_size, self.seed, self.num_replicas, self.rank = dataset_size, seed, num_replicas, rank
        self.minibatch_size = minibatch_size
        if isinstance(trace, str):
            self.trace = pd.read_csv(trace).batchsize.to_list()
        elif isinstance(trace, list):
            self.trace = trace
        elif isinstance(trace, int):
            self.trace = [trace] * 2000000
        tot_samples = 0
        for s in self.trace:
            if s % minibatch_size != 0:
                raise ValueError(f"Every Sample batch size should be multiple of {minibatch_size}")
            tot_samples += s
        self.minibatches_per_epoch = dataset_size // minibatch_size
        self.max_epoch = tot_samples // (self.minibatches_per_epoch * minibatch_size)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def get_batch_assignments(self, epochtrace):
        batches = []
        step_start = 0
        all_minibatches = list(range(self.minibatches_per_epoch))
        for i in range(len(epochtrace)):
            minibatches_per_step = epochtrace[i] // self.minibatch_size
            step_end = step_start + minibatches_per_step
            batches.append(all_minibatches[(step_start + self.rank) : step_end : self.num_replicas])
            step_start = step_end
        return batches

    def get_epoch_range(self, epoch):
        start, end, epochsum, e = 0, 0, 0, -1
        while e < epoch:
            start = end
            while epochsum + self.trace[end] <= self.minibatch_size * self.minibatches_per_epoch:
                epochsum += self.trace[end]
                end += 1
            e += 1
            epochsum = 0
        return start, end

    def get_epochtrace(self, epoch):
        start, end = self.get_epoch_range(epoch)
        return self.trace[start:end]

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        indices = torch.randperm(self.dataset_size, generator=g).tolist()
        indices = indices[: self.minibatches_per_epoch * self.minibatch_size]
        steplist = []
        for batches in self.get_batch_assignments(self.get_epochtrace(self.epoch)):
            if batches != []:
                for bi in batches:
                    steplist.append(indices[bi * self.minibatch_size : (bi + 1) * self.minibatch_size])
            else:
                steplist.append([0 for _ in range(self.minibatch_size)])
        return iter(steplist)


def original_run(model, x, y, loss_fn, trace, *, seed, num_replicas, minibatch_size, epochs, optimizer,
                 ref_batchsize, rule="linear", weight_decay=1e-4):
    """Train ``model`` as eth-easl's sampler + optimizer would over ``num_replicas`` ranks;
    returns the parameters after every update. ``rule``: 'linear' (LinearRuleOptimizer) or
    'momentum' (LinearRuleMomentumOptimizer, ``reduction='sum'``)."""
    samplers = [OriginalSampler(len(x), trace, seed, num_replicas, rank, minibatch_size)
                for rank in range(num_replicas)]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    history = []
    for epoch in epochs:
        for sampler in samplers:
            sampler.set_epoch(epoch)
        epochtrace = samplers[0].get_epochtrace(epoch)
        divisors = [t // minibatch_size for t in epochtrace]
        schedules = [sampler.get_batch_assignments(epochtrace) for sampler in samplers]
        batches = [iter(sampler) for sampler in samplers]
        for step_index, bs in enumerate(epochtrace):
            summed = None
            for rank in range(num_replicas):
                optimizer.zero_grad()
                subbatches = schedules[rank][step_index]
                for _ in range(max(len(subbatches), 1)):
                    index = torch.tensor(next(batches[rank]))
                    loss_fn(model(x[index]), y[index]).backward()
                grads = [torch.zeros_like(p) if not subbatches or p.grad is None else p.grad.clone() for p in params]
                summed = grads if summed is None else [a + b for a, b in zip(summed, grads, strict=True)]
            scale = 1.0 if rule == "momentum" else 1.0 / divisors[step_index]
            for p, grad in zip(params, summed, strict=True):
                p.grad = grad * scale
            ref_lr = tuple(group["lr"] for group in optimizer.param_groups)
            for group, rlr in zip(optimizer.param_groups, ref_lr, strict=True):  # adapt_lr
                if rule == "momentum":
                    group["lr"] = minibatch_size / ref_batchsize * rlr
                    group["weight_decay"] = weight_decay * divisors[step_index]
                else:
                    group["lr"] = bs / ref_batchsize * rlr
            optimizer.step()
            optimizer.zero_grad()
            for group, rlr in zip(optimizer.param_groups, ref_lr, strict=True):
                group["lr"] = rlr
            history.append([p.detach().clone() for p in params])
    return history
