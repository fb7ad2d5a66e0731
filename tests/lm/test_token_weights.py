"""accumulate(model, weight=tokens) in one process: the update's gradient is the big batch's
mean over every token (float64), whatever the micro-batches hold, and not the mean of the
micro-batch means; bf16 micro-batches accumulate within bf16's precision; a Hugging Face GPT-2
trains exactly; checkpoints resume to the same bits; every misuse is refused by name."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from lm_case import (
    CASES,
    CONTEXT,
    SEQUENCES,
    Case,
    batch,
    model,
    reference,
    sequences,
    token_loss,
    trace_reference,
    trace_sampler,
    train,
    train_trace,
)

from aikit.core.errors import InvalidType, InvalidValue
from aikit.datasets import IGNORE
from aikit.elastic.Torch import AdaScaleOptimizer, LinearRuleMomentumOptimizer, LinearRuleOptimizer
from aikit.ga.Torch.optim import Optimizer


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


def relative_error(got, want) -> float:
    return ((flat(got) - flat(want)).norm() / flat(want).norm()).item()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_process_equals_the_big_batch(case):
    expected, result = reference(case), train(case, "single")
    assert result["lrs"] == expected["lrs"]  # one scheduler step per update
    if case.bf16:  # autocast micro-batches, float32 accumulation: within bf16's precision
        assert relative_error(result["first_grads"], expected["first_grads"]) < 1e-2
        return
    for got, want in zip(result["first_grads"], expected["first_grads"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    for got, want in zip(result["params"], expected["params"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


def micro_step_gradients(case: Case, weigh) -> list[torch.Tensor]:
    """The first window's update gradient from 4 micro-batches of 2 sequences, each micro-batch's
    mean-loss gradient weighed by ``weigh(tokens)`` and the sum divided by the total weight."""
    data, net = sequences(), model(dtype=case.dtype)
    window = case.window_indices()[0]
    total = 0
    for part in np.array_split(window, 4):
        inputs, labels = batch(data, part)
        tokens = int((labels != IGNORE).sum())
        with torch.autocast("cpu", torch.bfloat16, enabled=case.bf16):
            logits = net(inputs)
        (token_loss(logits, labels) * weigh(tokens)).backward()
        total += weigh(tokens)
    return [p.grad / total for p in net.parameters()]


@pytest.mark.parametrize("bf16", [False, True], ids=["float64", "bf16"])
def test_the_mean_of_micro_batch_means_is_far_from_the_big_batch(bf16):
    """What the tests above would see if the weights were dropped: torchtune #1875's bug, by a
    margin far outside the tolerance they use (so they can fail)."""
    case = Case("probe", 8, 2, (8,), ("single",), bf16=bf16)
    expected = reference(case)["first_grads"]
    assert relative_error(micro_step_gradients(case, lambda tokens: 1), expected) > 0.1
    weighed = micro_step_gradients(case, lambda tokens: tokens)
    assert relative_error(weighed, expected) < (1e-2 if bf16 else 1e-14)


def test_int_and_tensor_weights_give_the_same_bits():
    case = next(c for c in CASES if c.name == "tokens-ragged")
    data = sequences()
    results = []
    for as_tensor in (False, True):
        net = model()
        optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.9), 4)
        for window in case.window_indices():
            for part in np.array_split(window, 4):
                inputs, labels = batch(data, part)
                tokens = (labels != IGNORE).sum()
                with optimizer.accumulate(net, weight=tokens if as_tensor else int(tokens)):
                    token_loss(net(inputs), labels).backward()
                optimizer.step()
        results.append(flat(p.detach() for p in net.parameters()))
    assert torch.equal(*results)


def test_a_hugging_face_gpt2_from_a_tiny_config_accumulates_to_the_big_batch():
    """GPT-2 computes its own loss from ``labels`` (shifted inside, ignoring -100): a micro-batch's
    loss is the mean over its labels but the first of each sequence, so that is its weight. The
    loss is inside the model's output (a ``ModelOutput``), and so is the weighing."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=256, n_positions=CONTEXT + 1, n_embd=16, n_layer=2, n_head=2,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    data = [np.concatenate(([7], s)) for s in sequences()]  # GPT-2 shifts: the first label is never scored
    window = np.arange(12)

    def gpt2() -> torch.nn.Module:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return transformers.GPT2LMHeadModel(config).double().train()

    def pieces(indices):
        inputs, labels = batch(data, indices)  # inputs padded with 0; labels -100 there and for prompts
        return inputs, torch.where(labels == IGNORE, IGNORE, inputs)  # GPT-2's labels: the inputs themselves

    reference_model = gpt2()
    inputs, labels = pieces(window)
    reference_model(input_ids=inputs, labels=labels).loss.backward()
    expected = [p.grad.clone() for p in reference_model.parameters()]

    net = gpt2()
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.0), 3)
    seen = []
    optimizer.register_step_pre_hook(lambda *_: seen.extend(p.grad.clone() for p in net.parameters()))
    for part in (window[:2], window[2:9], window[9:]):
        inputs, labels = pieces(part)
        with optimizer.accumulate(net, weight=(labels[:, 1:] != IGNORE).sum()):
            net(input_ids=inputs, labels=labels).loss.backward()
        optimizer.step()
    assert len(seen) == len(expected)
    # transformers computes the loss on logits cast to float32: float32's precision, in a float64 model
    assert relative_error(seen, expected) < 1e-6


@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "tensor"])
def test_a_micro_batch_without_tokens_adds_exactly_zero_even_when_its_mean_is_nan(as_tensor):
    """A hand-written token mean divides by the count: 0 / 0 over a micro-batch of prompts only,
    whose gradient is NaN everywhere. Its weight 0 must drop it, not multiply it."""
    data = sequences()

    def mean_over_tokens(logits, labels):
        scored = labels != IGNORE
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten().clamp(min=0),
                                                   reduction="none")
        return (losses * scored.flatten()).sum() / scored.sum()

    gradients = []
    for parts in ([[0, 1]], [[0, 1], [2, 7]]):  # sequences 2 and 7 are prompts: no token scored
        net = model()
        optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.0), len(parts))
        optimizer.register_step_pre_hook(lambda *_, net=net: gradients.append(flat(p.grad for p in net.parameters())))
        for part in parts:
            inputs, labels = batch(data, part)
            tokens = (labels != IGNORE).sum()
            with optimizer.accumulate(net, weight=tokens if as_tensor else int(tokens)):
                loss = mean_over_tokens(net(inputs), labels)
                loss.backward()
            assert torch.isnan(loss) == (part == [2, 7])
            optimizer.step()
    assert torch.equal(gradients[1], gradients[0])


def train_window(optimizer, net, data, window, parts: int = 4, stop_after: int | None = None) -> None:
    for index, part in enumerate(np.array_split(window, parts)):
        if index == stop_after:
            return
        inputs, labels = batch(data, part)
        with optimizer.accumulate(net, weight=(labels != IGNORE).sum()):
            token_loss(net(inputs), labels).backward()
        optimizer.step()


def test_a_checkpoint_saved_mid_update_resumes_to_the_same_bits():
    data, windows = sequences(), Case("c", 8, 2, (8, 8), ()).window_indices()

    def build():
        net = model()
        return net, Optimizer(torch.optim.AdamW(net.parameters(), lr=0.02), 4, max_grad_norm=0.5)

    net, optimizer = build()
    for window in windows:
        train_window(optimizer, net, data, window)
    straight = flat(p.detach() for p in net.parameters())

    net, optimizer = build()
    train_window(optimizer, net, data, windows[0])
    train_window(optimizer, net, data, windows[1], stop_after=3)
    saved = {"model": net.state_dict(), "optimizer": optimizer.state_dict()}
    assert saved["optimizer"]["ga"]["terms"] == sum(
        int((batch(data, part)[1] != IGNORE).sum()) for part in np.array_split(windows[1], 4)[:3])
    net, optimizer = build()
    net.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    inputs, labels = batch(data, np.array_split(windows[1], 4)[3])
    with optimizer.accumulate(net, weight=(labels != IGNORE).sum()):
        token_loss(net(inputs), labels).backward()
    optimizer.step()
    assert optimizer.updated and torch.equal(flat(p.detach() for p in net.parameters()), straight)


def test_an_update_without_any_token_is_refused_and_changes_nothing():
    net, data = model(), sequences()
    prompts = [i for i in range(SEQUENCES) if i % 5 == 2][:2]  # every label ignored
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), 2)
    before = flat(p.detach().clone() for p in net.parameters())
    for index in prompts:
        inputs, labels = batch(data, [index])
        with optimizer.accumulate(net, weight=(labels != IGNORE).sum()):
            token_loss(net(inputs), labels).backward()  # NaN: the mean over no token
        if index == prompts[-1]:
            with pytest.raises(InvalidValue, match=r"this update's micro-batches hold 0 loss terms on every replica "
                                                   r"together, so it has no mean gradient"):
                optimizer.step()
        else:
            optimizer.step()
    assert torch.equal(flat(p.detach() for p in net.parameters()), before)
    assert optimizer.micro_step == 0 and all(p.grad is None for p in net.parameters())
    assert not optimizer.optimizer.state  # the inner optimizer never stepped
    train_window(optimizer, net, data, np.arange(4), parts=2)  # and training goes on
    assert optimizer.updated


def refused(optimizer, net, data, error, message, **declared) -> None:
    inputs, labels = batch(data, [0, 1])
    with pytest.raises(error, match=message), optimizer.accumulate(net, **declared):
        token_loss(net(inputs), labels).backward()


def test_misuses_of_weight_are_refused_by_name():
    net, data = model(), sequences()
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, global_batch_size=4)
    refused(optimizer, net, data, InvalidValue, r"accumulate\(\) got samples=2 and weight=5: a micro-batch's mean "
            r"loss is a mean over its samples \(samples=\) or over its loss terms", samples=2, weight=5)
    refused(optimizer, net, data, InvalidType, r"weight must be an integer >= 0, got 2.5; the number of loss terms",
            weight=2.5)
    refused(optimizer, net, data, InvalidValue, r"weight must be an integer >= 0, got -3", weight=-3)
    refused(optimizer, net, data, InvalidValue, r"weight must be an integer >= 0, got -3",
            weight=torch.tensor(-3))
    refused(optimizer, net, data, InvalidType, r"weight must be an integer count of loss terms, got a "
            r"torch.float32 tensor", weight=torch.tensor(5.0))
    refused(optimizer, net, data, InvalidValue, r"weight must be one count \(a 0-d tensor\), got a tensor of "
            r"shape \(2,\)", weight=torch.tensor([2, 3]))
    assert optimizer.state_dict()["ga"]["terms"] is None  # nothing was counted
    no_model = r"accumulate\(weight=...\) weighs the gradient entering the model's outputs: pass the model"
    with pytest.raises(InvalidValue, match=no_model), optimizer.accumulate(weight=3):
        pass
    not_called = r"but the model \(TinyLM\) was not called inside the context: run the forward of the model you pass"
    with pytest.raises(InvalidValue, match=not_called), optimizer.accumulate(net, weight=3):
        pass
    optimizer.zero_grad()
    summing = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, reduction="sum")
    refused(summing, net, data, InvalidValue, r"accumulate\(weight=4\) weighs a mean loss's micro-batch by its loss "
            r"terms, but this optimizer sums the micro-batch gradients \(reduction='sum'\)", weight=4)


def test_an_update_declares_one_kind_of_weight_in_every_micro_step():
    net, data = model(), sequences()
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, global_batch_size=4)
    train_window(optimizer, net, data, np.arange(2), parts=1)  # one micro-step with weight=
    refused(optimizer, net, data, InvalidValue, r"this micro-step declares samples=, but the update's earlier ones "
            r"declared weight=: declare the same in every micro-step of an update", samples=2)
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2)
    train_window(optimizer, net, data, np.arange(2), parts=1)
    inputs, labels = batch(data, [2, 3])
    token_loss(net(inputs), labels).backward()
    with pytest.raises(InvalidValue, match=r"only 1 of the 2 micro-steps of this update declared weight= in "
                                           r"accumulate\(\): declare them in every micro-step or in none"):
        optimizer.step()


def test_reduce_and_sync_every_micro_step_together_are_refused():
    net = model()
    with pytest.raises(InvalidValue, match=r"sync_every_micro_step=True asks DDP or FSDP2 to sync the gradients in "
                                           r"every backward, but this optimizer sums them over the replicas itself"):
        Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, reduce=True, sync_every_micro_step=True)


def test_a_trace_optimizer_weighs_its_micro_batches_by_their_tokens():
    result, expected = train_trace(), trace_reference()
    assert result["updates"] == 5
    for got, want in zip(result["first_grads"], expected["first_grads"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    for got, want in zip(result["params"], expected["params"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cls", [AdaScaleOptimizer, LinearRuleMomentumOptimizer])
def test_trace_optimizers_that_weigh_their_own_way_refuse_weight(cls):
    net, data = model(), sequences()
    sampler = trace_sampler(1, 0)
    optimizer = cls(torch.optim.SGD(net.parameters(), lr=0.1), sampler, ref_batch_size=8)
    refused(optimizer, net, data, InvalidValue, rf"{cls.__name__} weighs micro-batches its own way \(a sum, or "
            r"gradient noise measured from equal micro-batch means\), so it takes no weight=", weight=3)


def test_a_trace_step_that_declares_tokens_for_some_micro_batches_only_is_refused():
    net, data = model(), sequences()
    sampler = trace_sampler(1, 0)
    optimizer = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), sampler, ref_batch_size=8)
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    batches = iter(sampler)
    inputs, labels = batch(data, next(batches))
    with optimizer.accumulate(net, weight=(labels != IGNORE).sum()):
        token_loss(net(inputs), labels).backward()
    optimizer.step()
    for _ in range(3):  # the first step's other micro-batches, undeclared
        inputs, labels = batch(data, next(batches))
        token_loss(net(inputs), labels).backward()
        if _ < 2:
            optimizer.step()
    with pytest.raises(InvalidValue, match=r"1 of the 4 micro-batches of step 0 declared their loss terms with "
                                           r"accumulate\(model, weight=...\): declare them for every micro-batch"):
        optimizer.step()
