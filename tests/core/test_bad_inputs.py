"""Issue 13's bad inputs, one by one: each ends in an aikit error that names the value (or the
file and line) and the fix, never a wrong number, a hang or a raw pandas/numpy traceback."""

from __future__ import annotations

import struct
import time

import pytest

from aikit.cli import main
from aikit.core.errors import AikitError, InvalidType, InvalidValue, TraceFileError
from aikit.core.plan import make_plan
from aikit.core.schedule import Schedule
from aikit.core.trace import Trace, TraceExhaustedError, TraceTooShortError, load_trace


def write(tmp_path, content: str | bytes, name: str = "trace.csv"):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# ---- exact integers -----------------------------------------------------------------------


@pytest.mark.parametrize(("size", "shown"), [
    ("1e30", "1000000000000000000000000000000"),
    ("9223372036854775808", "9223372036854775808"),
    ("-9223372036854775808", "-9223372036854775808"),
])
def test_a_size_int64_cannot_hold_is_refused_with_its_row(tmp_path, size, shown):
    path = write(tmp_path, f"step,batchsize\n0,64\n1,{size}\n")
    with pytest.raises(TraceFileError, match=rf"trace {path}: row 1 \(step 1, line 3\) has batch size {shown}; every "
                       r"batch size must be a positive integer of at most 9223372036854775807"):
        load_trace(path)


def test_sizes_are_exact_integers_without_a_float_round_trip(tmp_path):
    big = [9007199254740993, 9223372036854775807, 64]  # 2**53 + 1 is no float64; int64's largest
    path = write(tmp_path, "step,batchsize\n" + "".join(f"{i},{s}\n" for i, s in enumerate(big)))
    assert load_trace(path).sizes.tolist() == big
    assert Trace(big).sizes.tolist() == big
    assert load_trace(write(tmp_path, "step,batchsize\n0, 64.0\n1,6.4e1\n", "floats.csv")).sizes.tolist() == [64, 64]


@pytest.mark.parametrize(("sizes", "error", "message"), [
    ([64, 1e30], InvalidValue, r"row 1 \(step 1\) has batch size 1e\+30"),
    ([64, 2.0**60], InvalidValue, r"row 1 \(step 1\) has batch size 1\.15292e\+18"),
    ([64, 2**63], InvalidValue, r"row 1 \(step 1\) has batch size 9223372036854775808"),
    ([64, "64"], InvalidType, r"row 1 \(step 1\) has batch size '64', a str"),
    ([True], InvalidType, r"row 0 \(step 0\) has batch size True, a bool"),
])
def test_a_list_with_an_inexact_or_foreign_size_is_refused(sizes, error, message):
    with pytest.raises(error, match=message):
        Trace(sizes)


def test_a_size_above_the_data_set_fails_trace_check(tmp_path, capsys):
    path = write(tmp_path, "step,batchsize\n0,9223372036854775807\n")
    assert main(["trace", "check", str(path), "--micro-batch", "1", "--dataset-size", "1000"]) == 1
    assert "batch size 9223372036854775807 is larger than the data set (1000 samples)" in capsys.readouterr().out


# ---- trace files: the file and the right line ---------------------------------------------


@pytest.mark.parametrize(("content", "message"), [
    (b"", r"trace {path} is empty: write a 'step,batchsize' header"),
    (b"  \n\n", r"trace {path} is empty"),
    (b"step,batchsize\n0,64\n1,\xff64\n", r"trace {path}, line 3: byte 0xff is not UTF-8 text: save it as UTF-8"),
    ("step,batchsize\n0,64\n".encode("utf-16"), r"trace {path} is UTF-16 text: save it as UTF-8"),
    ("step,batchsize\n0,64\n".encode("utf-16-le"), r"trace {path} is UTF-16 text"),
    (b"step,batchsize\n0,64\n1,64,3\n", r"trace {path}: row 1 \(step 1, line 3\) has 3 fields, the header has 2"),
    (b"step,batchsize\n0\n", r"row 0 \(step 0, line 2\) has 1 fields, the header has 2"),
    (b"\n\nstep,batchsize\n\n0,64\n\n\n1,zero\n", r"row 1 \(step 1, line 8\) has batch size 'zero'"),
    (b"\nstep,batchsize\n\n0,64\n-2,64\n", r"row 1 \(step 1, line 5\) has step '-2'; it must be a non-negative"),
    (b"size\n64\n", r"trace {path}, line 1: columns must be 'step,batchsize', found \['size'\]"),
    (b"step,batchsize\n0,64\x00\n", r"trace {path}, line 2: a NUL byte"),
    # binary data is binary data, not UTF-16 text (which a zero among its first two bytes made it)
    (struct.pack("<4q", 64, 0, 64, 1), r"trace {path}, line 1: a NUL byte, which no text holds: a trace is "
                                         r"plain 'step,batchsize' CSV text, not binary data"),
    (b"\x93NUMPY\x01\x00v\x00{'descr': '<i8'", r"trace {path}, line 1: control byte 0x01, .*not binary data"),
    (b'step,batchsize\n0,"64\n', r"trace {path}, line 2: not CSV \(unexpected end of data\)"),
])
def test_a_malformed_file_is_named_with_the_right_line(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(TraceFileError, match=message.format(path=path)):
        load_trace(path)


def test_a_directory_or_a_missing_file_as_the_trace(tmp_path, capsys):
    with pytest.raises(TraceFileError, match=rf"trace {tmp_path} is a directory: give the path of a"):
        load_trace(tmp_path)
    assert main(["trace", "check", str(tmp_path), "--micro-batch", "8", "--dataset-size", "100"]) == 2
    assert f"aikit: error: trace {tmp_path} is a directory" in capsys.readouterr().err
    with pytest.raises(TraceFileError, match=rf"trace {tmp_path / 'no.csv'} does not exist"):
        load_trace(tmp_path / "no.csv")
    with pytest.raises(TraceFileError, match=r"trace path 'a\\x00.csv' holds a NUL character: give the path of a"):
        load_trace("a\x00.csv")  # found by tests/core/test_fuzz.py: open() raised a bare ValueError


def test_a_missing_relative_trace_names_the_working_directory_it_was_read_in(tmp_path, monkeypatch):
    """Issue 47: under Ray Train a relative "trace.csv" is read in the worker's own directory, and
    the error did not say where it had looked; an absolute path needs no more than its name."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceFileError) as raised:
        load_trace("trace.csv")
    assert str(raised.value) == (
        f"trace trace.csv does not exist in the working directory {tmp_path}: a relative path is read from the "
        "process's working directory, and Ray Train runs each worker in a directory of its own, not the driver's; "
        "give an absolute path, resolved where the file is (str(Path('trace.csv').resolve()) on the driver)")
    with pytest.raises(TraceFileError) as raised:
        load_trace(tmp_path / "trace.csv")
    assert str(raised.value) == f"trace {tmp_path / 'trace.csv'} does not exist: give the path of a 'step,batchsize' " \
                                "CSV file"


def test_a_trace_that_cannot_make_the_first_epoch_is_refused_as_bad_input():
    """Found by tests/core/test_fuzz.py: CustomSampler(2, [1], ...) raised a RuntimeError for a
    trace of fewer samples than the data set (no first epoch): that is bad input."""
    with pytest.raises(TraceTooShortError, match=r"epoch 0 needs steps past the end of the trace \(list, 1 steps\), "
                       r"which covers 0 full epochs of 2 samples: extend the trace") as error:
        Schedule(load_trace([1]), 2, micro_batch=1).epoch(0)
    assert isinstance(error.value, ValueError) and isinstance(error.value, TraceExhaustedError)
    with pytest.raises(TraceExhaustedError) as error:  # a later epoch past the end is not bad input
        Schedule(load_trace([1, 1]), 2, micro_batch=1).epoch(1)
    assert not isinstance(error.value, ValueError)


def test_the_stop_policy_message_does_not_recommend_stop():
    schedule = Schedule(load_trace([40, 40, 40], "stop"), 100, micro_batch=20)
    assert len(schedule.epoch(1)) == 1  # epoch 1 is the trace's partial last one
    with pytest.raises(TraceExhaustedError, match=r"epoch 2 is past the end of the trace \(list, 3 steps\): with "
                       r"when_exhausted='stop' training ends in epoch 1, so train epochs 0..1 only") as error:
        schedule.epoch(2)
    assert "'stop' (train" not in str(error.value)


# ---- types at the public API and plans ----------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(dataset_size="100"), InvalidType, "dataset_size must be a positive integer, got '100'"),
    (dict(seed=1.7), InvalidType, "seed must be a non-negative integer, got 1.7"),
    (dict(seed=-1), InvalidValue, "seed must be a non-negative integer, got -1"),
    (dict(num_replicas="2"), InvalidType, "num_replicas must be a positive integer, got '2'"),
    (dict(micro_batch=2000), InvalidValue, "micro_batch must be at most 1000, got 2000: a micro-batch cannot"),
    (dict(dataset_size=2**41), InvalidValue, "dataset_size must be at most 1099511627776, got 2199023255552"),
    (dict(shuffle="yes"), InvalidType, "shuffle must be True or False, got 'yes'"),
])
def test_schedule_arguments_are_checked_by_name(kwargs, error, message):
    arguments = dict(trace=[64], dataset_size=1000, num_replicas=1, micro_batch=32, seed=0) | kwargs
    with pytest.raises(error, match=message):
        Schedule(**arguments)


@pytest.mark.parametrize(("rank", "error", "message"), [
    (5, InvalidValue, r"rank must be an integer in 0..1, got 5"),
    ("0", InvalidType, r"rank must be an integer in 0..1, got '0'"),
    (-1, InvalidValue, r"rank must be an integer in 0..1, got -1"),
])
def test_make_plan_checks_the_rank(rank, error, message):
    with pytest.raises(error, match=message):
        make_plan(256, 64, 2, rank=rank)


@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    ((10**18, 64), {}, (1, 15625000000000000, 64)),
    ((10**9 + 7, 2), {"policy": "fewer_devices"}, (1, 10**9 + 7, 1)),
    ((256, 64, 10**9), {"policy": "fewer_devices"}, (256, 1, 1)),
    ((10**30, 64, 8), {"policy": "fewer_devices"}, (8, 10**30 // 512, 64)),
    ((2**127 - 1, 64, 8), {"policy": "fewer_devices"}, (1, 2**127 - 1, 1)),  # a prime
])
def test_huge_plans_are_instant(args, kwargs, expected):
    start = time.perf_counter()
    plan = make_plan(*args, **kwargs)
    assert (plan.gpus, plan.steps, plan.batch_size) == expected
    assert plan.samples_per_update == plan.global_batch_size == args[0]
    assert time.perf_counter() - start < 1.0


def test_a_batch_fewer_devices_cannot_factor_quickly_is_refused():
    semiprime = (2**127 - 1) * (2**107 - 1)
    with pytest.raises(InvalidValue, match=r"policy 'fewer_devices' needs the divisors of the global batch, .* use "
                       r"policy 'ragged'"):
        make_plan(semiprime, 10, 8, policy="fewer_devices")


# ---- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--gpus", "0"], 2, "aikit: error: --gpus must be a positive integer, got 0"),
    (["--global-batch-size", "0"], 2, "aikit: error: --global-batch-size must be a positive integer, got 0"),
    (["--gpus", "3", "--policy", "error"], 1, "refused: global_batch_size 256 does not split evenly over 3"),
])
def test_plan_exits_non_zero_when_it_refuses(capsys, argv, code, message):
    arguments = {"--global-batch-size": "256", "--max-gpu-batch-size": "64"}
    arguments.update(dict(zip(argv[::2], argv[1::2], strict=True)))
    assert main(["plan", *[x for pair in arguments.items() for x in pair]]) == code
    out = capsys.readouterr()
    assert message in out.out + out.err


def test_plan_answers_instantly_for_a_huge_batch(capsys):
    start = time.perf_counter()
    assert main(["plan", "--global-batch-size", str(10**18), "--max-gpu-batch-size", "64"]) == 0
    assert time.perf_counter() - start < 2.0
    assert "15625000000000000" in capsys.readouterr().out


def test_trace_check_refuses_a_trace_that_does_not_cover_its_first_epoch(tmp_path, capsys):
    path = write(tmp_path, "step,batchsize\n0,32\n1,32\n")  # 64 samples of a data set of 1000
    assert main(["trace", "check", str(path), "--micro-batch", "32", "--dataset-size", "1000"]) == 1
    out = capsys.readouterr().out
    assert "epoch 0 needs steps past the end of the trace" in out and "1 problem(s)" in out
    assert main(["trace", "check", str(path), "--micro-batch", "32", "--dataset-size", "1000",
                 "--when-exhausted", "stop"]) == 0


@pytest.mark.parametrize("action", [["make", "constant", "--start", "64", "--steps", "3"], ["plot", "TRACE"]])
def test_trace_output_into_a_missing_folder_is_named(tmp_path, capsys, action):
    trace = write(tmp_path, "step,batchsize\n0,64\n")
    target = tmp_path / "missing" / "out"
    argv = ["trace", *[str(trace) if a == "TRACE" else a for a in action], "-o", str(target)]
    assert main(argv) == 2
    assert (f"aikit: error: cannot write {target}: the folder {target.parent} does not exist; create it"
            in capsys.readouterr().err)


def test_every_refusal_is_an_aikit_error_and_a_builtin_one():
    assert issubclass(InvalidType, TypeError) and issubclass(InvalidType, ValueError)
    assert issubclass(TraceFileError, ValueError) and issubclass(TraceExhaustedError, AikitError)
