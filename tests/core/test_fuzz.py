"""Fuzzing the inputs a user types: trace files as arbitrary bytes, and integers and wrong types
for the public constructors. Every outcome is a result or an aikit error (a ValueError/TypeError
subclass naming the argument, or the file and line), never a raw pandas, numpy or Python
exception, and never a hang: each case runs under a wall-clock alarm."""

from __future__ import annotations

import contextlib
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aikit.core.errors import AikitError, TraceFileError
from aikit.core.plan import make_plan
from aikit.core.schedule import Schedule
from aikit.core.trace import Trace, load_trace

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Hang(Exception):
    pass


@contextlib.contextmanager
def bounded(seconds: int = 5):
    """Fail the case (instead of hanging the suite) if it runs longer than ``seconds``."""
    def expire(*_):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome(call):
    """The result, or the aikit error raised; anything else fails the test."""
    with bounded():
        try:
            return call()
        except AikitError as error:
            assert isinstance(error, (ValueError, TypeError)), type(error)
            return error


# ---- trace files ---------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(-3, 300).map(str), st.integers(2**52, 2**70).map(str), st.floats(allow_nan=True).map(repr),
    st.sampled_from(["", " 64", "64.0", "6.4e1", "1e30", "1e999999", "nan", "-inf", "0x40", "1_000", "６４", '"64"',
                     '"6', "64 32"]),
)
lines = st.one_of(
    st.tuples(numbers, numbers).map(",".join), st.lists(numbers, max_size=4).map(",".join),
    st.sampled_from(["", "   ", "step,batchsize", " step, batchsize", "batchsize,step", "size"]),
)
csv_texts = st.tuples(st.sampled_from(["step,batchsize", " step,batchsize ", "", "Step,BatchSize,extra"]),
                      st.lists(lines, max_size=8), st.sampled_from(["\n", "\r\n"])).map(
    lambda t: t[2].join([t[0], *t[1]]))
encodings = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1"])


@FUZZ
@given(content=st.one_of(st.binary(max_size=300), st.tuples(csv_texts, encodings).map(
    lambda t: t[0].encode(t[1], errors="replace"))))
def test_any_bytes_as_a_trace_file_load_or_are_named(tmp_path, content):
    path = tmp_path / "fuzz.csv"
    path.write_bytes(content)
    result = outcome(lambda: load_trace(path))
    if isinstance(result, Trace):
        assert len(result) > 0 and result.sizes.min() > 0
    else:
        assert isinstance(result, TraceFileError) and f"trace {path}" in str(result)


@FUZZ
@given(sizes=st.lists(st.integers(1, 2**63 - 1), min_size=1, max_size=20))
def test_trace_files_keep_every_integer_exactly(tmp_path, sizes):
    path = tmp_path / "exact.csv"
    path.write_text("step,batchsize\n" + "".join(f"{i},{s}\n" for i, s in enumerate(sizes)))
    assert load_trace(path).sizes.tolist() == sizes


# ---- constructors: integers and types ---------------------------------------------------------

anything = st.one_of(st.integers(-(2**70), 2**70), st.integers(-3, 70), st.floats(), st.text(max_size=3),
                     st.none(), st.booleans(), st.lists(st.integers(0, 3), max_size=2))


@FUZZ
@given(g=anything, m=anything, n=anything, rank=anything,
       policy=st.sampled_from(["ragged", "fewer_devices", "error", "even", 3]))
def test_make_plan_answers_any_input_in_bounded_time(g, m, n, rank, policy):
    result = outcome(lambda: make_plan(g, m, n, policy=policy, rank=rank))
    if isinstance(result, Exception):
        assert any(name in str(result) for name in ("global_batch_size", "max_device_batch", "gpus", "policy",
                                                    "rank"))
    else:
        assert result.samples_per_update == g and result.batch_size <= m and result.gpus <= n
        assert result.steps == 1 or (result.steps - 1) * result.gpus * m < g or policy != "ragged"


@FUZZ
@given(trace=st.one_of(anything, st.lists(anything, max_size=4)), dataset_size=anything, num_replicas=anything,
       micro_batch=anything, seed=anything)
def test_schedule_answers_any_input_naming_the_argument(trace, dataset_size, num_replicas, micro_batch, seed):
    result = outcome(lambda: Schedule(trace, dataset_size, num_replicas, micro_batch, seed))
    if isinstance(result, Exception):
        assert any(name in str(result) for name in ("trace", "dataset_size", "num_replicas", "micro_batch",
                                                    "seed"))


@FUZZ
@given(dataset=st.one_of(st.integers(-3, 5000), st.text(max_size=4), st.floats(), st.none()),
       trace=st.one_of(st.integers(-3, 600), st.lists(st.integers(-3, 600), max_size=5)),
       replicas=st.one_of(st.integers(-1, 5), st.text(max_size=1)), rank=st.one_of(st.integers(-1, 5), st.floats()),
       minibatch=st.one_of(st.integers(-1, 70), st.floats()), seed=st.one_of(st.integers(-2, 2**70), st.floats()))
def test_custom_sampler_answers_any_input_naming_the_argument(dataset, trace, replicas, rank, minibatch, seed):
    sampler = pytest.importorskip("aikit.elastic.Torch")
    result = outcome(lambda: sampler.CustomSampler(dataset, trace, seed, replicas, rank, minibatch))
    if isinstance(result, Exception):
        assert any(name in str(result) for name in ("data set", "dataset", "trace", "num_replicas", "rank",
                                                    "micro_batch", "seed", "epoch 0"))
    else:
        assert len(result) == int(result.epoch_schedule.counts(result.rank).sum())
