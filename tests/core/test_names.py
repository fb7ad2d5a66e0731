"""One name per setting, the original systems' names kept: aikit's ``micro_batch``,
``max_device_batch`` and ``ref_batch_size`` are eth-easl's ``minibatch_size``, Run:AI's
``max_gpu_batch_size`` and eth-easl's ``ref_batchsize`` (aikit 0.1's ``base_batch`` for the
adaptive run); either name works, a message names the one written, and both are refused."""

from __future__ import annotations

import pytest

from aikit.cli import main
from aikit.core.errors import InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.plan import make_plan
from aikit.core.schedule import Schedule
from aikit.core.validate import aliased


def test_aliased_returns_the_value_and_the_name_written_and_refuses_both():
    assert aliased(8, None, "micro_batch", "minibatch_size", "eth-easl") == (8, "micro_batch")
    assert aliased(None, 8, "micro_batch", "minibatch_size", "eth-easl") == (8, "minibatch_size")
    assert aliased(None, None, "micro_batch", "minibatch_size", "eth-easl") == (None, "micro_batch")
    with pytest.raises(InvalidValue) as raised:
        aliased(8, 8, "micro_batch", "minibatch_size", "eth-easl")
    assert str(raised.value) == ("micro_batch and minibatch_size are one setting (minibatch_size is eth-easl's name "
                                 "for it): give one, got micro_batch=8 and minibatch_size=8")


def test_the_plan_takes_max_device_batch_or_run_ais_max_gpu_batch_size():
    plan = make_plan(256, max_device_batch=64, gpus=4)
    assert plan == make_plan(256, max_gpu_batch_size=64, gpus=4) == make_plan(256, 64, 4)
    assert plan.max_device_batch == plan.max_gpu_batch_size == 64  # Run:AI's table keeps its field names
    with pytest.raises(InvalidValue, match="max_gpu_batch_size must be a positive integer, got 0"):
        make_plan(256, max_gpu_batch_size=0)
    with pytest.raises(InvalidValue, match="max_device_batch and max_gpu_batch_size are one setting"):
        make_plan(256, 64, max_gpu_batch_size=64)
    with pytest.raises(InvalidValue, match="max_device_batch is required"):
        make_plan(256)


def test_the_schedule_takes_micro_batch_or_eth_easls_minibatch_size_and_names_the_one_written():
    a, b = Schedule([64, 32] * 4, 200, 2, micro_batch=16), Schedule([64, 32] * 4, 200, 2, minibatch_size=16)
    assert a.micro_batch == a.minibatch_size == b.micro_batch == 16
    assert (a.epoch(0).order == b.epoch(0).order).all() and a.epoch(0).micro_batch == a.epoch(0).minibatch_size == 16
    assert Schedule([64], 200).micro_batch == 32  # the default, as eth-easl's
    with pytest.raises(InvalidValue, match=r"batch size 40 is not a multiple of micro_batch 16"):
        Schedule([40], 200, micro_batch=16)
    with pytest.raises(InvalidValue, match=r"batch size 40 is not a multiple of minibatch_size 16"):
        Schedule([40], 200, minibatch_size=16)
    with pytest.raises(InvalidValue, match="micro_batch and minibatch_size are one setting"):
        Schedule([64], 200, 1, 16, minibatch_size=16)
    with pytest.raises(InvalidValue, match=r"give minibatch_size .* or max_device_batch .*not both"):
        Schedule([64], 200, minibatch_size=16, max_device_batch=32)


def test_the_controller_takes_ref_batch_size_or_base_batch_and_names_the_one_written():
    new = GoodputController(32, ref_batch_size=64, max_batch=256)
    old = GoodputController(32, base_batch=64, max_batch=256)
    assert new.ref_batch_size == new.base_batch == old.ref_batch_size == new.batch == 64
    with pytest.raises(InvalidValue, match=r"need min_batch <= ref_batch_size <= max_batch, got 64, 64, 32"):
        GoodputController(32, ref_batch_size=64, max_batch=32)
    with pytest.raises(InvalidValue, match=r"need min_batch <= base_batch <= max_batch"):
        GoodputController(32, base_batch=64, max_batch=32)
    with pytest.raises(InvalidValue, match="ref_batch_size and base_batch are one setting"):
        GoodputController(32, ref_batch_size=64, base_batch=64, max_batch=256)
    with pytest.raises(InvalidValue, match="ref_batch_size is required"):
        GoodputController(32, max_batch=256)


def test_the_command_line_takes_both_spellings_and_refuses_both(capsys):
    assert main(["plan", "--global-batch-size", "256", "--max-device-batch", "64", "--gpus", "2"]) == 0
    new = capsys.readouterr().out
    assert main(["plan", "--global-batch-size", "256", "--max-gpu-batch-size", "64", "--gpus", "2"]) == 0
    assert capsys.readouterr().out == new
    assert main(["plan", "--global-batch-size", "256", "--max-device-batch", "64", "--max-gpu-batch-size", "64"]) == 2
    assert "--max-device-batch and --max-gpu-batch-size are one setting" in capsys.readouterr().err
    assert main(["plan", "--global-batch-size", "256"]) == 2
    assert "give --max-device-batch" in capsys.readouterr().err


def test_trace_check_takes_micro_batch_or_minibatch_size(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    path.write_text("step,batchsize\n0,64\n1,40\n")
    for flag, name in (("--micro-batch", "micro_batch"), ("--minibatch-size", "minibatch_size")):
        assert main(["trace", "check", str(path), flag, "16", "--dataset-size", "1000"]) == 1
        assert f"batch size 40 is not a multiple of {name} 16" in capsys.readouterr().out
    assert main(["trace", "check", str(path), "--micro-batch", "8", "--minibatch-size", "8",
                 "--dataset-size", "1000"]) == 2
    assert "--micro-batch and --minibatch-size are one setting" in capsys.readouterr().err
