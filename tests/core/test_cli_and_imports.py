"""The aikit command and the promise that the core loads no framework."""

import re
import subprocess
import sys

import pytest

from aikit.cli import main


def test_plan_prints_seed_002_table(capsys):
    assert main(["plan", "--global-batch-size", "256", "--max-gpu-batch-size", "64"]) == 0
    rows = {line.split()[0]: line.split()[1:4] for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["1"] == ["1", "4", "64"] and rows["2"] == ["2", "2", "64"]
    assert rows["4"] == ["4", "1", "64"] and rows["8"] == ["8", "1", "32"]
    assert rows["3"] == ["3", "2", "42..43"]


def test_plan_for_one_device_count_shows_the_summary(capsys):
    assert main(["plan", "--global-batch-size", "100", "--max-gpu-batch-size", "30", "--gpus", "1"]) == 0
    assert "GA steps per update: 4" in capsys.readouterr().out


def test_plan_bad_input_is_an_error_not_a_traceback(capsys):
    assert main(["plan", "--global-batch-size", "0", "--max-gpu-batch-size", "64", "--gpus", "2"]) == 2
    assert "--global-batch-size must be a positive integer, got 0" in capsys.readouterr().err


def test_trace_check_reports_epochs_and_every_problem(tmp_path, capsys):
    good = tmp_path / "good.csv"
    assert (
        main(
            [
                "trace",
                "make",
                "steps",
                "--start",
                "64",
                "--end",
                "256",
                "--every",
                "10",
                "--steps",
                "40",
                "-o",
                str(good),
            ]
        )
        == 0
    )
    assert (
        main(["trace", "check", str(good), "--minibatch-size", "32", "--replicas", "2", "--dataset-size", "1000"]) == 0
    )
    out = capsys.readouterr().out
    assert "full epochs of 1000 samples:" in out and "epoch 0: steps 0.." in out and "0 problem(s)" in out

    bad = tmp_path / "bad.csv"
    bad.write_text("step,batchsize\n 0, 1024\n 1, 100\n 2, 70000\n")
    assert main(["trace", "check", str(bad), "--minibatch-size", "32", "--dataset-size", "60000"]) == 1
    out = capsys.readouterr().out
    assert "row 1 (step 1): batch size 100 is not a multiple of minibatch_size 32; use 96 or 128" in out
    assert "row 2 (step 2): batch size 70000 is larger than the data set" in out
    assert "3 problem(s)" in out


def test_trace_check_splits_each_step_as_an_adaptive_run_with_max_device_batch(tmp_path, capsys):
    trace = tmp_path / "adaptive.csv"
    trace.write_text("step,batchsize\n0,32\n1,31\n2,100\n3,67\n")
    assert main(["trace", "check", str(trace), "--max-device-batch", "64", "--dataset-size", "1000"]) == 1
    out = capsys.readouterr().out
    assert "row 3 (step 3): batch size 67 does not split evenly over 1 replica(s) in micro-batches of at most " \
           "max_device_batch 64; use 66 or 68" in out and "1 problem(s)" in out  # 31 and 100 split: 1x31, 2x50
    assert main(["trace", "check", str(trace), "--max-device-batch", "64", "--noise-every", "2",
                 "--dataset-size", "1000"]) == 1  # step 2 of 100 splits in two; step 0 too, 67 still not
    for bad, message in (
        (["--minibatch-size", "8", "--max-device-batch", "64"], "give --minibatch-size .* one of them"),
        (["--max-device-batch", "0"], "--max-device-batch must be a positive integer, got 0"),
        (["--minibatch-size", "8", "--noise-every", "2"], "--noise-every splits steps"),
    ):
        assert main(["trace", "check", str(trace), "--dataset-size", "1000", *bad]) == 2
        assert re.search(message, capsys.readouterr().err)


def test_trace_plot_writes_a_png(tmp_path):
    trace = tmp_path / "t.csv"
    main(
        [
            "trace",
            "make",
            "ramp",
            "--start",
            "32",
            "--end",
            "512",
            "--steps",
            "100",
            "--multiple-of",
            "32",
            "-o",
            str(trace),
        ]
    )
    assert main(["trace", "plot", str(trace), "-o", str(tmp_path / "t.png"), "--dataset-size", "3000"]) == 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "module", ["aikit", "aikit.core", "aikit.cli", "aikit.elastic", "aikit.ga", "aikit.lr_finder", "aikit.autolrs"]
)
def test_importing_aikit_loads_no_framework(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_elastic_attributes_before_init_say_what_to_do():
    code = "import aikit.elastic\ntry:\n    aikit.elastic.steps\nexcept AttributeError as e:\n    print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "aikit.elastic.steps is set by init(): call aikit.elastic.Torch.init(...)" in out
