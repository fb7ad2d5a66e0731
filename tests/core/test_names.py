"""One name per setting, the original systems' names kept at the edge: aikit's ``micro_batch``,
``max_device_batch`` and ``ref_batch_size`` are eth-easl's ``minibatch_size``, Run:AI's
``max_gpu_batch_size`` and eth-easl's ``ref_batchsize`` (aikit 0.1's ``base_batch`` for the
adaptive run). The core speaks aikit's names alone; the public entry points take either name
(``aikit.runtime.originals``), a message names the one written, and both are refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aikit.cli import main
from aikit.core.errors import InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.plan import make_plan
from aikit.core.schedule import Schedule
from aikit.runtime.originals import ORIGINAL_NAMES, either, max_device_batch_of

ROOT = Path(__file__).resolve().parents[2]
KEPT = {"aikit/core/plan.py: max_gpu_batch_size"}  # Plan keeps Run:AI's table's names as properties (the issue)


def test_either_returns_the_value_and_the_name_written_and_refuses_both():
    assert either("minibatch_size", 8, None) == (8, "micro_batch")
    assert either("minibatch_size", None, 8) == (8, "minibatch_size")
    assert either("minibatch_size", None, None) == (None, "micro_batch")
    assert either("minibatch_size", None, 8, flags=True) == (8, "--minibatch-size")
    with pytest.raises(InvalidValue) as raised:
        either("minibatch_size", 8, 8)
    assert str(raised.value) == ("micro_batch and minibatch_size are one setting (minibatch_size is eth-easl's name "
                                 "for it): give one, got micro_batch=8 and minibatch_size=8")


def test_the_core_names_no_setting_by_an_original_systems_name():
    """No function or class of aikit.core takes, or is, an original's name: the aliases are
    resolved at the edge, once (the issue counted aliased() calls in three core modules)."""
    offenders = []
    for path in sorted((ROOT / "aikit" / "core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in (*node.args.args, *node.args.kwonlyargs)] + [node.name]
            elif isinstance(node, ast.Call):
                names = [getattr(node.func, "id", getattr(node.func, "attr", ""))]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                          if name in ORIGINAL_NAMES or name == "aliased"]
    assert [offender for offender in offenders if offender.split(":")[0] + ":" + offender.split(":")[2]
            not in KEPT] == []


def test_the_plan_takes_max_device_batch_and_keeps_run_ais_names_as_properties():
    plan = make_plan(256, max_device_batch=64, gpus=4)
    assert plan == make_plan(256, 64, 4)
    assert plan.max_device_batch == plan.max_gpu_batch_size == 64  # Run:AI's table keeps its names
    assert plan.device_batch == plan.batch_size == 64
    with pytest.raises(TypeError, match="max_gpu_batch_size"):
        make_plan(256, max_gpu_batch_size=64)  # the core takes aikit's name: init() takes Run:AI's
    assert max_device_batch_of(None, 64) == max_device_batch_of(64) == 64
    with pytest.raises(InvalidValue, match="max_gpu_batch_size must be a positive integer, got 0"):
        max_device_batch_of(None, 0)
    with pytest.raises(InvalidValue, match="max_device_batch and max_gpu_batch_size are one setting"):
        max_device_batch_of(64, 64)
    with pytest.raises(InvalidValue, match="max_device_batch is required"):
        max_device_batch_of(None)


def test_the_schedule_names_the_micro_batch_as_its_caller_says():
    a = Schedule([64, 32] * 4, 200, 2, micro_batch=16)
    b = Schedule([64, 32] * 4, 200, 2, 16, micro_name="minibatch_size")
    assert a.micro_batch == b.micro_batch == a.epoch(0).micro_batch == 16
    assert (a.epoch(0).order == b.epoch(0).order).all()
    assert Schedule([64], 200).micro_batch == 32  # the default, as eth-easl's
    with pytest.raises(InvalidValue, match=r"batch size 40 is not a multiple of micro_batch 16"):
        Schedule([40], 200, micro_batch=16)
    with pytest.raises(InvalidValue, match=r"batch size 40 is not a multiple of minibatch_size 16"):
        Schedule([40], 200, micro_batch=16, micro_name="minibatch_size")
    with pytest.raises(InvalidValue, match=r"give minibatch_size .* or max_device_batch .*not both"):
        Schedule([64], 200, micro_batch=16, micro_name="minibatch_size", max_device_batch=32)
    grown = Schedule([64, 32] * 4, 200, 2, max_device_batch=16)
    assert grown.micro_batch is None and grown.epoch(0).micro_batch is None  # one meaning: each step has its own
    assert grown.max_device_batch == 16 and grown.epoch(0).micro_sizes.tolist()[:2] == [16, 16]


def test_the_controller_takes_ref_batch_size():
    controller = GoodputController(32, ref_batch_size=64, max_batch=256)
    assert controller.ref_batch_size == controller.batch == 64
    with pytest.raises(InvalidValue, match=r"need min_batch <= ref_batch_size <= max_batch, got 64, 64, 32"):
        GoodputController(32, ref_batch_size=64, max_batch=32)
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


def test_trace_check_takes_micro_batch_and_refuses_eth_easls_spelling(tmp_path, capsys):
    """``aikit trace check`` is aikit's command: it speaks ``--micro-batch`` (eth-easl's users wrote
    no command line, so it offers no eth-easl spelling), and messages name the flag's setting."""
    path = tmp_path / "trace.csv"
    path.write_text("step,batchsize\n0,64\n1,40\n")
    assert main(["trace", "check", str(path), "--micro-batch", "16", "--dataset-size", "1000"]) == 1
    assert "batch size 40 is not a multiple of micro_batch 16" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["trace", "check", str(path), "--minibatch-size", "8", "--dataset-size", "1000"])
    assert "unrecognized arguments: --minibatch-size" in capsys.readouterr().err

