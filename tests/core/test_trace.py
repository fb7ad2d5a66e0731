"""Traces: loading, the errors bad rows get, end-of-trace policies and generators."""

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core import trace as tr
from aikit.core.trace import Trace, TraceExhaustedError, TraceStepWarning, load_trace


def write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_seed_spacing_is_read(tmp_path):
    path = write(tmp_path, " step,batchsize\n 0, 1024\n 1, 1024\n 2, 2048\n")
    assert load_trace(path).sizes.tolist() == [1024, 1024, 2048]


def test_list_and_int_sources():
    assert load_trace([32, 64]).sizes.tolist() == [32, 64]
    constant = load_trace(128)
    assert constant.when_exhausted == "repeat_last"
    assert constant.window(0, 5).tolist() == [128] * 5
    assert constant[10**9] == 128


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("step,size\n0,32\n", r"columns must be 'step,batchsize', found \['step', 'size'\]"),
        ("step,batchsize\n0,32\n1,0\n", r"row 1 \(step 1, line 3\) has batch size 0"),
        ("step,batchsize\n0,32\n1,-64\n", r"row 1 \(step 1, line 3\) has batch size -64"),
        ("step,batchsize\n0,32\n1,48.5\n", r"row 1 \(step 1, line 3\) has batch size '48.5'"),
        ("step,batchsize\n0,32\n1,abc\n", r"row 1 \(step 1, line 3\) has batch size 'abc'"),
        ("step,batchsize\n0,32\n1,\n", r"row 1 \(step 1, line 3\) has batch size ''"),
        ("step,batchsize\n0,32\n-1,32\n", r"row 1 \(step 1, line 3\) has step '-1'; it must be a non-negative"),
        ("step,batchsize\n0,32\nx,32\n", r"row 1 \(step 1, line 3\) has step 'x'; it must be a non-negative"),
        ("step,batchsize\n", "has no rows"),
    ],
)
def test_bad_csv_rows_are_named(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_trace(write(tmp_path, text))


def test_bad_list_entries_are_named():
    with pytest.raises(ValueError, match=r"row 2 \(step 2\) has batch size 0"):
        load_trace([32, 64, 0])
    with pytest.raises(ValueError, match="at least one batch size"):
        load_trace([])
    with pytest.raises(ValueError, match="trace batch size must be a positive integer, got -3"):
        load_trace(-3)
    with pytest.raises(ValueError, match="when_exhausted must be one of"):
        load_trace([32], "wrap")


def test_exhaustion_policies():
    sizes = [32, 64, 96]
    with pytest.raises(TraceExhaustedError, match=r"has 3 steps \(0..2\) but step 4 was asked for"):
        load_trace(sizes).window(0, 5)
    assert load_trace(sizes, "repeat_last").window(2, 6).tolist() == [96, 96, 96, 96]
    assert load_trace(sizes, "cycle").window(2, 6).tolist() == [96, 32, 64, 96]


def test_csv_round_trip(tmp_path):
    trace = tr.linear_ramp(32, 512, 50, multiple_of=32)
    trace.to_csv(tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv").sizes.tolist() == trace.sizes.tolist()


def test_multiple_problems_suggest_valid_sizes():
    problems = tr.multiple_problems(Trace([64, 100, 16]), 32, "minibatch_size")
    assert problems == [
        "row 1 (step 1): batch size 100 is not a multiple of minibatch_size 32; use 96 or 128",
        "row 2 (step 2): batch size 16 is not a multiple of minibatch_size 32; use 32",
    ]


def test_generators():
    assert tr.constant(64, 3).sizes.tolist() == [64, 64, 64]
    ramp = tr.linear_ramp(64, 256, 7, multiple_of=32)
    assert ramp.sizes[0] == 64 and ramp.sizes[-1] == 256 and (np.diff(ramp.sizes) >= 0).all()
    held = tr.linear_ramp(64, 256, 10, ramp_steps=4)
    assert held.sizes.tolist()[3:] == [256] * 7
    smith = tr.step_increase(128, 5, every=3, steps=9, maximum=2000)
    assert smith.sizes.tolist() == [128] * 3 + [640] * 3 + [2000] * 3
    with pytest.raises(ValueError, match="factor must be positive, got 0"):
        tr.step_increase(128, 0, every=3, steps=9)
    with pytest.raises(ValueError, match=r"factor must be finite, got inf: the batch is multiplied by it every `every` "
                                         r"steps \(up to `maximum`\), e.g. 2"):
        tr.step_increase(32, math.inf, every=2, steps=5)  # was 32, 32, then the maximum (or an int64 overflow)


@pytest.mark.parametrize("make", [lambda: tr.constant(64, 10**11), lambda: tr.linear_ramp(32, 64, 10**8 + 1),
                                  lambda: tr.step_increase(32, 2, 10, 10**11)])
def test_a_generated_trace_longer_than_a_trace_holds_is_refused_before_it_is_made(make):
    with pytest.raises(ValueError, match=r"^steps must be at most 100,000,000 \(10\*\*8\), got "):
        make()  # a MemoryError, before
    assert tr.MAX_TRACE_STEPS == 10**8


@given(
    start=st.integers(1, 4096),
    end=st.integers(1, 4096),
    steps=st.integers(1, 500),
    multiple=st.sampled_from([1, 8, 32]),
)
def test_ramps_are_monotone_multiples_between_their_ends(start, end, steps, multiple):
    sizes = tr.linear_ramp(start, end, steps, multiple_of=multiple).sizes
    assert len(sizes) == steps and (sizes % multiple == 0).all() and (sizes > 0).all()
    diffs = np.diff(sizes)
    assert (diffs >= 0).all() if end >= start else (diffs <= 0).all()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("step,batchsize\n0,32\n2,32\n", r"row 1 \(step 1, line 3\) has step '2', expected 1"),
        ("step,batchsize\n0,32\n1,32\n0,32\n", r"row 2 \(step 2, line 4\) has step '0', expected 2"),
    ],
)
def test_strict_steps_refuses_a_step_column_out_of_order(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_trace(write(tmp_path, text), strict_steps=True)


def test_a_concatenated_trace_is_read_in_file_order_with_a_warning_naming_the_rows(tmp_path):
    """eth-easl's own sample trace is three runs concatenated: its step column restarts. Their
    sampler reads the batchsize column in file order and ignores the step column; so does aikit,
    and it says where the column restarts."""
    runs = [[32, 64, 64, 128], [32, 32, 64], [256, 512]]
    rows = [f"{step}, {size}" for run in runs for step, size in enumerate(run)]
    path = write(tmp_path, "step,batchsize\n" + "\n".join(rows) + "\n")
    with pytest.warns(TraceStepWarning, match=r"restarts or skips at 2 row\(s\) \(row 4, line 6: step 0; "
                                              r"row 7, line 9: step 0\); the batch sizes are read in file order"):
        trace = load_trace(path)
    assert trace.sizes.tolist() == [size for run in runs for size in run]
    with pytest.raises(ValueError, match=r"row 4 \(step 4, line 6\) has step '0', expected 4"):
        load_trace(path, strict_steps=True)


def test_many_jumps_are_summarised(tmp_path):
    path = write(tmp_path, "step,batchsize\n" + "\n".join(f"{7 * i},32" for i in range(9)) + "\n")
    with pytest.warns(TraceStepWarning, match=r"at 8 row\(s\) .*row 5, line 7: step 35; and 3 more\)"):
        assert len(load_trace(path)) == 9


def test_trace_check_reads_a_concatenated_trace_and_strict_steps_refuses_it(tmp_path):
    from aikit.cli import main

    path = write(tmp_path, "step,batchsize\n0,32\n1,64\n0,32\n1,64\n")
    args = ["trace", "check", str(path), "--micro-batch", "32", "--dataset-size", "192"]
    with pytest.warns(TraceStepWarning, match=r"row 2, line 4: step 0"):
        assert main(args) == 0
    assert main([*args, "--strict-steps"]) == 2


@pytest.mark.parametrize("size", ["6_4", "\u0666\u0664", "\uff16\uff14", "64\u200b", "+\u0036\u0034_0"])
def test_digits_other_than_ascii_are_refused_not_read_as_64(tmp_path, size):
    """Python's int() and Decimal read '6_4', Arabic-Indic and full-width digits as 64."""
    path = write(tmp_path, f"step,batchsize\n0,32\n1,{size}\n")
    with pytest.raises(ValueError, match=rf"row 1 \(step 1, line 3\) has batch size {re.escape(repr(size))}; it must "
                                         "be a positive integer"):
        load_trace(path)
    path = write(tmp_path, f"step,batchsize\n0,32\n{size},32\n")
    with pytest.raises(ValueError, match=rf"row 1 \(step 1, line 3\) has step {re.escape(repr(size))}; it must be a "
                                         "non-negative"):
        load_trace(path)


def test_a_fifo_is_refused_without_being_opened(tmp_path):
    """Opening a FIFO for reading waits for a writer: the loader must not open what is not a
    regular file (the test would hang, and time out, if it did)."""
    import os
    import threading

    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    found = []

    def read() -> None:
        try:
            load_trace(fifo)
        except ValueError as error:
            found.append(str(error))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    if reader.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("load_trace opened the FIFO and waited for a writer")
    assert found[0] == (f"trace {fifo} is a FIFO, not a regular file: reading it could wait for ever; "
                                   "write the trace to a 'step,batchsize' CSV file and give its path")


def test_generated_sizes_stay_between_the_ends_as_multiples():
    """Rounding to multiples took a ramp to 112 up to 128, past its end."""
    assert tr.linear_ramp(32, 112, 5, multiple_of=32).sizes.tolist() == [32, 64, 64, 96, 96]
    assert tr.step_increase(32, 2, 2, 10, maximum=100, multiple_of=32).sizes.max() == 96
