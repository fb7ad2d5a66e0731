"""The aikit command and the promise that the core loads no framework."""

import math
import os
import re
import subprocess
import sys

import pytest

from aikit.cli import main
from aikit.core.trace import load_trace


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
        main(["trace", "check", str(good), "--micro-batch", "32", "--replicas", "2", "--dataset-size", "1000"]) == 0
    )
    out = capsys.readouterr().out
    assert "full epochs of 1000 samples:" in out and "epoch 0: steps 0.." in out and "0 problem(s)" in out

    bad = tmp_path / "bad.csv"
    bad.write_text("step,batchsize\n 0, 1024\n 1, 100\n 2, 70000\n")
    assert main(["trace", "check", str(bad), "--micro-batch", "32", "--dataset-size", "60000"]) == 1
    out = capsys.readouterr().out
    assert "row 1 (step 1): batch size 100 is not a multiple of micro_batch 32; use 96 or 128" in out
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
    held = tmp_path / "held.csv"  # a run that measured on every step, then held its batch from step 1
    held.write_text("step,batchsize\n0,32\n1,31\n2,31\n")
    measured = ["trace", "check", str(held), "--max-device-batch", "64", "--noise-every", "1", "--dataset-size", "94"]
    assert main(measured) == 1 and "2 problem(s)" in capsys.readouterr().out  # 31 does not split in two halves
    assert main([*measured, "--noise-until", "1"]) == 0  # held: steps 1 and 2 run whole
    for bad, message in (
        (["--micro-batch", "8", "--max-device-batch", "64"], "give --micro-batch .* one of them"),
        (["--max-device-batch", "0"], "--max-device-batch must be a positive integer, got 0"),
        (["--micro-batch", "8", "--noise-every", "2"], "--noise-every splits steps"),
        (["--micro-batch", "8", "--noise-until", "2"], "--noise-until splits steps"),
        (["--max-device-batch", "64", "--noise-until", "-1"], "--noise-until must be a non-negative integer, got -1"),
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


@pytest.mark.parametrize("option", ["--micro-batch", "--max-device-batch"])
def test_trace_check_refuses_a_zero_micro_batch_as_the_sampler_does(tmp_path, capsys, option):
    """It used to read a micro-batch of 0 as 1 and exit 0, where TraceSampler refuses 0: the error
    names the option given."""
    trace = tmp_path / "t.csv"
    trace.write_text("step,batchsize\n0,32\n")
    assert main(["trace", "check", str(trace), option, "0", "--dataset-size", "64"]) == 2
    assert f"aikit: error: {option} must be a positive integer, got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["constant", "--start", "100", "--steps", "3", "--multiple-of", "32"],
         "--start 100 is not a multiple of --multiple-of 32: use 96 or 128"),
        (["ramp", "--start", "32", "--end", "112", "--steps", "5", "--multiple-of", "32"],
         "--end 112 is not a multiple of --multiple-of 32: use 96 or 128"),
        (["steps", "--start", "32", "--end", "100", "--steps", "9", "--multiple-of", "32"],
         "--end 100 is not a multiple of --multiple-of 32: use 96 or 128"),
    ],
)
def test_trace_make_honours_multiple_of_or_says_why_not(tmp_path, capsys, args, message):
    """--multiple-of was ignored for constant, and a ramp's rounding went past --end."""
    assert main(["trace", "make", *args, "-o", str(tmp_path / "t.csv")]) == 2
    assert f"aikit: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    # --factor inf wrote 32, 32, then 256 for ever (no --end: a batch of -9223372036854775808)
    (["steps", "--start", "32", "--factor", "inf", "--every", "2", "--steps", "5", "--end", "256"],
     "--factor must be a finite number above 0, got inf; the batch is multiplied by it every --every steps (up to "
     "--end), e.g. --factor 2"),
    (["steps", "--start", "32", "--factor", "nan", "--steps", "5"],
     "--factor must be a finite number above 0, got nan"),
    (["steps", "--start", "32", "--factor", "0", "--steps", "5"],
     "--factor must be a finite number above 0, got 0.0"),
    # a ZeroDivisionError
    (["constant", "--start", "64", "--steps", "3", "--multiple-of", "0"],
     "--multiple-of must be a positive integer, got 0; every batch size is a multiple of it; 1 (the default) allows "
     "any"),
    # a MemoryError from building the list
    (["constant", "--start", "64", "--steps", "100000000000"],
     "--steps must be at most 100,000,000 (10**8), got 100,000,000,000: a trace holds one row per step, and 10**8 "
     "is ten times the longest runs trained; give fewer steps, or a shorter trace that repeats "
     "(when_exhausted='repeat_last' or 'cycle')"),
    (["ramp", "--start", "32", "--end", "64", "--steps", "100000001"], "--steps must be at most 100,000,000 (10**8)"),
    (["schedule", "0:1", "--samples", "1T"],
     "schedule '0:1' over 1,000,000,000,000 samples makes at least 1,000,000,000,000 steps, more than 100,000,000 "
     "(10**8): a trace holds one row per step"),
])
def test_trace_make_refuses_what_it_cannot_write_before_writing(tmp_path, capsys, args, message):
    output = tmp_path / "t.csv"
    assert main(["trace", "make", *args, "-o", str(output)]) == 2
    assert f"aikit: error: {message}" in capsys.readouterr().err
    assert not output.exists()


def test_trace_check_refuses_a_negative_show_epochs(tmp_path, capsys):
    """--show-epochs -1 listed nothing and exited 0."""
    trace = tmp_path / "t.csv"
    trace.write_text("step,batchsize\n0,32\n1,32\n")
    check = ["trace", "check", str(trace), "--micro-batch", "8", "--dataset-size", "64", "--show-epochs"]
    assert main([*check, "-1"]) == 2
    assert capsys.readouterr() == ("", "aikit: error: --show-epochs must be a non-negative integer, got -1\n")
    assert main([*check, "0"]) == 0
    assert "epoch 0" not in capsys.readouterr().out
    assert main(["trace", "check", "--schedule", "0:8", "--steps", "100000000000", "--micro-batch", "8",
                 "--dataset-size", "64"]) == 2
    assert "aikit: error: --steps must be at most 100,000,000 (10**8), got 100,000,000,000" in capsys.readouterr().err


@pytest.mark.parametrize("number", ["6_4", "\u0666\u0664", "\uff16\uff14"])
def test_options_take_ascii_digits_only(tmp_path, capsys, number):
    """argparse's int() reads '6_4' and Arabic-Indic digits as 64."""
    with pytest.raises(SystemExit) as exit_:
        main(["trace", "make", "constant", "--start", number, "--steps", "3", "-o", str(tmp_path / "t.csv")])
    assert exit_.value.code == 2
    assert f"argument --start: {number!r} is not a whole number written in ASCII digits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["trace", "make", "rampup", "16", "8", number, "--global-batch-size", "64", "--steps", "3"])
    assert "is not a number: write ASCII digits" in capsys.readouterr().err


def test_trace_check_refuses_a_fifo_without_waiting(tmp_path, capsys):
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "aikit.cli", "trace", "check", str(fifo), "--micro-batch", "4",
                           "--dataset-size", "64"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is a FIFO, not a regular file" in done.stderr


def test_trace_make_writes_schedules_in_samples_and_tokens_and_shows_their_stages(tmp_path, capsys):
    out = tmp_path / "megatron.csv"
    assert main(["trace", "make", "schedule", "0:768 250B:1536 500B:3072", "--seq-length", "4096", "--tokens",
                 "600B", "--micro-batch", "4", "--world", "8", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "schedule 0:768 250B:1536 500B:3072 (thresholds in tokens, seq_length 4096):" in text
    assert ("entry 2 ('250B:1536'): from 250,000,000,000 tokens = 61,035,156 samples: batch 1536, steps 79473..119209"
            in text)
    assert load_trace(out).sizes[79472:79474].tolist() == [768, 1536]
    assert main(["trace", "make", "rampup", "16", "8", "300K", "--global-batch-size", "1024", "--samples", "1M",
                 "-o", str(tmp_path / "nemo.csv")]) == 0
    assert "entry 127 ('increment 126'): from 300,000 samples: batch 1024" in capsys.readouterr().out
    assert main(["trace", "make", "stages", "--batch", "1024", "--samples", "10M", "-o", str(tmp_path / "n.csv")]) == 0
    assert "schedule 0:256 300K:512 1M:1024 (thresholds in samples)" in capsys.readouterr().out
    assert main(["trace", "make", "seesaw", "--start", "64", "--max-batch", "256", "--milestones", "30K", "60K", "90K",
                 "--samples", "100K", "-o", str(tmp_path / "s.csv")]) == 0
    assert "schedule 0:64 30K:128 60K:256 (thresholds in samples)" in capsys.readouterr().out
    backwards = ["trace", "make", "schedule", "0:768 500B:1536 250B:3072", "--seq-length", "4096", "--tokens", "1T"]
    assert main(backwards) == 2
    assert "thresholds must increase" in capsys.readouterr().err


def test_trace_check_and_plot_show_a_schedule(tmp_path, capsys):
    schedule = ["--schedule", "0:64 2K:128 5K:256", "--samples", "8K"]
    assert main(["trace", "check", *schedule, "--micro-batch", "32", "--replicas", "2", "--dataset-size",
                 "3000"]) == 0
    out = capsys.readouterr().out
    assert "entry 2 ('2K:128'): from 2,000 samples: batch 128, steps 32..55 (24 steps, samples 2,048..5,120)" in out
    assert "0 problem(s)" in out
    assert main(["trace", "check", *schedule, "--micro-batch", "48", "--dataset-size", "3000"]) == 1
    out = capsys.readouterr().out
    assert "row 0 (step 0): batch size 64 is not a multiple of micro_batch 48; use 48 or 96" in out
    assert main(["trace", "plot", *schedule, "-o", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    trace = tmp_path / "t.csv"
    trace.write_text("step,batchsize\n0,32\n")
    assert main(["trace", "check", str(trace), *schedule, "--micro-batch", "32", "--dataset-size", "64"]) == 2
    assert "give a trace file or --schedule" in capsys.readouterr().err


def test_frontier_fits_the_grid_and_names_the_time_optimal_batch(capsys):
    # updates to the target of a grid on McCandlish's frontier with S_min 200, E_min 64,000 (B_crit 320)
    runs = [f"{b}:{200 + 64_000 // b}" for b in (32, 64, 128, 256, 512)]
    assert main(["frontier", *runs, "1024:-", "--per-update", "4.5e-3", "--per-sample", "13.6e-6"]) == 0
    out = capsys.readouterr().out
    assert "S_min 200 updates, E_min 64000 samples, critical batch 320" in out
    assert "   128      700     89600    1.00" in out  # a fixed batch on the frontier: an excess of 1
    assert "  1024      inf       inf     inf" in out  # a run that never reached the target: off every frontier
    assert f"the time-optimal fixed batch is {math.sqrt(4.5e-3 * 320 / 13.6e-6):.0f}" in out


@pytest.mark.parametrize("args, message", [
    (["32:900", "64:-"], "two or more batch sizes that reached the target, got 1 of 2"),
    (["32:100", "64:200"], "off McCandlish's model"),
    (["32:900", "64:500", "--per-update", "1e-3"], "give both --per-update and --per-sample"),
])
def test_frontier_bad_runs_are_errors_that_say_why(capsys, args, message):
    assert main(["frontier", *args]) == 2
    assert message in capsys.readouterr().err


def test_frontier_refuses_a_run_that_is_not_batch_colon_updates(capsys):
    with pytest.raises(SystemExit):
        main(["frontier", "32=900"])
    assert "'32=900' is not BATCH:UPDATES" in capsys.readouterr().err
