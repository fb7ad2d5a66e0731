"""LR rules against a reference batch size, with Goyal-style warmup."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core.gradient_noise import NoiseEstimate
from aikit.core.scaling import adaptive_lr, adaptive_rule_name, scale_factor, scaled_lr


def test_rules():
    assert scaled_lr(0.1, 512, 128, "linear") == pytest.approx(0.4)
    assert scaled_lr(0.1, 512, 128, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 512, 128, "root") == pytest.approx(0.2)
    assert scaled_lr(0.1, 512, 128, "constant") == 0.1
    assert scaled_lr(0.01, 32, 128) == pytest.approx(0.0025)  # the seed's MNIST range: 0.0025..0.16
    assert scaled_lr(0.01, 2048, 128) == pytest.approx(0.16)


def test_warmup_ramps_the_scale_from_one():
    lrs = [scaled_lr(0.1, 1024, 128, step=t, warmup_steps=4) for t in range(6)]
    assert lrs == pytest.approx([0.275, 0.45, 0.625, 0.8, 0.8, 0.8])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: scale_factor(0, 128), "batch must be a positive integer, got 0"),
        (lambda: scale_factor(64, -1), "ref_batch_size must be a positive integer, got -1"),
        (lambda: scale_factor(64, 128, "cubic"), "LR rule must be one of"),
        (lambda: scaled_lr(-0.1, 64, 128), "base_lr must be a finite number >= 0, got -0.1"),
        (lambda: scaled_lr(0.1, 64, 128, step=-1, warmup_steps=3), "step must be a non-negative integer, got -1"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@given(b=st.integers(1, 10**6), ref=st.integers(1, 10**6), k=st.integers(1, 64))
def test_linear_is_proportional_and_sqrt_is_its_root(b, ref, k):
    assert math.isclose(scale_factor(k * b, ref) / scale_factor(b, ref), k)
    assert math.isclose(scale_factor(b, ref, "sqrt") ** 2, scale_factor(b, ref), rel_tol=1e-9)


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.floats(1e-6, 10.0))
def test_after_warmup_the_lr_is_exactly_the_rules_product_as_eth_easl_computes_it(batch, ref, lr):
    """eth-easl's F(ref_lr, batchsize, ref_batchsize) = batchsize / ref_batchsize * ref_lr, to the
    last bit (``1 + (f - 1)`` is not f: 1/10 would come out 0.09999999999999998)."""
    assert scaled_lr(lr, batch, ref, "linear") == batch / ref * lr
    assert scaled_lr(lr, batch, ref, "linear", step=5, warmup_steps=3) == batch / ref * lr


@given(st.integers(1, 4096), st.integers(1, 4096), st.floats(0.0, 1e3), st.floats(0.0, 1e3),
       st.floats(1e-6, 10.0))
def test_adaptive_lr_is_the_base_lr_times_adascales_gain(batch, base, trace, grad_sq, lr):
    noise = NoiseEstimate(grad_sq=grad_sq, trace=trace)
    # AdaScale's gain written out (Johnson et al., 2020): E|g_base|² / E|g_batch|²
    expected = 1.0 if trace == grad_sq == 0 else (trace / base + grad_sq) / (trace / batch + grad_sq)
    assert adaptive_lr(lr, batch, base, "adascale", noise) == pytest.approx(lr * expected, rel=1e-12)
    assert adaptive_lr(lr, base, base, "adascale", noise) == lr  # exactly the base LR at the base batch
    assert adaptive_lr(lr, batch, base, "adascale", None) == lr  # and before a first estimate
    for rule in ("linear", "sqrt", "root", "constant"):  # the other rules are scaled_lr's, warmup included
        assert adaptive_lr(lr, batch, base, rule, noise, 2, 5) == scaled_lr(lr, batch, base, rule, 2, 5)


def test_adaptive_rules_and_bad_input():
    assert adaptive_rule_name("adascale") == "adascale" and adaptive_rule_name("root") == "sqrt"
    with pytest.raises(ValueError, match=r"LR rule must be one of \('adascale', 'linear', 'sqrt', 'constant'\), "
                                         r"got 'cubic'"):
        adaptive_lr(0.1, 64, 32, "cubic", None)
    with pytest.raises(ValueError, match="base_lr must be a finite number >= 0, got nan"):
        adaptive_lr(math.nan, 64, 32, "adascale", None)
