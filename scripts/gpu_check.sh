#!/usr/bin/env bash
# The GPU check (issue 39): every CUDA path aikit has, proven on this machine's GPU in one call.
#
#   bash scripts/gpu_check.sh          # a GPU machine: a few minutes on an H100, never more than 8 (each part bounded)
#   bash scripts/gpu_check.sh --cpu    # any machine: the same tests on the CPU device (their CUDA cases
#                                      # skip, naming why) and the benchmark's quick mode; tests/test_gpu_check.py
#
# From a bare machine of the GPU image (Python 3.12, torch + CUDA, pytest; no TensorFlow, no network):
# aikit runs from this working tree through PYTHONPATH, nothing is installed (its install_requires,
# numpy, pandas, scipy and tqdm, and safetensors are in that image). Three parts, each under `timeout`
# so that a hang in one still lets the others run and the table print: the environment and the
# imports of aikit's torch adapters (which must load no TensorFlow, Keras or JAX), tests/cuda (pytest
# with --confcutdir tests/cuda: the suite's other conftests need packages the image lacks) and
# benchmarks/gpu.py. Logs go to $OUT when it is set (the device tool brings back what is there:
# env.txt, tests.log, bench.log, bench.json, table.txt), else to a new temporary folder. The table
# comes last (scripts/gpu_check_table.py); the exit status is 1 when a test fails, the benchmark
# fails or, on a GPU, misses a goal, or a part runs out of time. --cpu uses this repo's .venv when
# there is one; PYTHON=... picks the interpreter.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
case "${1:-}" in
    --cpu) MODE=cpu ;;
    "") MODE=cuda ;;
    *) echo "usage: bash scripts/gpu_check.sh [--cpu]" >&2; exit 2 ;;
esac
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ "$MODE" = cpu ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
LOGS="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/aikit-gpu-check.XXXXXX")}"
mkdir -p "$LOGS"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg GPU_CHECK_MODE="$MODE"
unset WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT  # one process, whatever launched us
if [ "$MODE" = cpu ]; then
    export CUDA_VISIBLE_DEVICES=""  # the CPU device, even on a GPU machine
    ENV_LIMIT=60 TEST_LIMIT=240 BENCH_LIMIT=120 BENCH_ARGS=(--quick)
else
    export AIKIT_REQUIRE_CUDA=1  # a GPU that torch cannot see fails the CUDA cases instead of skipping them
    ENV_LIMIT=45 TEST_LIMIT=240 BENCH_LIMIT=150 BENCH_ARGS=()  # with nvidia-smi's 15 s and 10 s of grace each: 8 minutes
fi
PARTS=()

run_part() {  # NAME LIMIT LOG COMMAND...: the command's output to LOG, bounded by LIMIT seconds
    local name="$1" limit="$2" log="$3" started status
    shift 3
    started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
    status=$?
    PARTS+=(--part "$name=$status/$((SECONDS - started))/$limit")
    return "$status"
}

echo "aikit GPU check ($MODE mode), python: $PY, logs: $LOGS"
{ date -u; uname -a; command -v nvidia-smi > /dev/null && timeout 15 nvidia-smi; } > "$LOGS/env.txt" 2>&1
run_part "imports" "$ENV_LIMIT" "$LOGS/imports.txt" "$PY" - <<'EOF'
import os
import sys

import torch

import aikit
import aikit.elastic.Torch
import aikit.ga.Torch
import aikit.lr_finder.Torch

print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"aikit {aikit.__version__} from {os.path.dirname(aikit.__file__)}")
print(f"GPUs torch sees: {torch.cuda.device_count()}"
      + "".join(f"; {i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())))
loaded = sorted({name.split(".")[0] for name in sys.modules} & {"tensorflow", "keras", "jax", "sybil"})
assert not loaded, f"aikit's torch adapters imported {loaded}, which the GPU image lacks or must not need"
here = os.path.realpath(os.path.join(os.getcwd(), "aikit"))
assert os.path.realpath(os.path.dirname(aikit.__file__)) == here, "aikit is not this working tree's"
assert os.environ["GPU_CHECK_MODE"] == "cpu" or torch.cuda.is_available(), "torch sees no GPU"
EOF
tee -a "$LOGS/env.txt" < "$LOGS/imports.txt"
rm -f "$LOGS/imports.txt"

echo "tests/cuda (at most $TEST_LIMIT s) ..."
run_part "tests/cuda" "$TEST_LIMIT" "$LOGS/tests.log" "$PY" -m pytest tests/cuda --confcutdir=tests/cuda \
    -p no:cacheprovider -v -ra --tb=short --durations=8
sed -n '/short test summary info/,$p' "$LOGS/tests.log" | grep -v '^SKIPPED' | tail -n 40

echo "benchmarks/gpu.py${BENCH_ARGS[*]:+ ${BENCH_ARGS[*]}} (at most $BENCH_LIMIT s) ..."
run_part "benchmarks/gpu.py" "$BENCH_LIMIT" "$LOGS/bench.log" "$PY" benchmarks/gpu.py \
    ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} --json "$LOGS/bench.json"
if grep -q '^ratios' "$LOGS/bench.log"; then sed -n '/^ratios/,$p' "$LOGS/bench.log"; else tail -n 30 "$LOGS/bench.log"; fi

echo
DEVICE="$(sed -n 's/^GPUs torch sees: [0-9]*; 0: //p' "$LOGS/env.txt" | cut -d';' -f1)"
"$PY" scripts/gpu_check_table.py "$LOGS" --mode "$MODE" --device "${DEVICE:-CPU}" "${PARTS[@]}"
