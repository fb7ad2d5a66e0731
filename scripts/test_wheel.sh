#!/usr/bin/env bash
# aikit as users install it: build the sdist and the wheel, `twine check` them, then install the
# wheel into a fresh virtual environment per extra — none, torch, tf-cpu (into an environment that
# has tensorflow-cpu already: no second TensorFlow may come with it), and torch+tf-cpu with the
# trainer integrations and Ray, and jax (Keras on JAX, no TensorFlow: KERAS_BACKEND=jax runs its Keras
# examples) — and, from a folder outside the checkout, run every CLI command and every
# example's quickest mode, and check that a missing optional dependency names the extra to install.
# The tf extra (the full `tensorflow`) is checked in the wheel's metadata, not installed: on this
# CPU machine the test stack is tensorflow-cpu.
#
#   bash scripts/test_wheel.sh [PYTHON]     # PYTHON: one with `build` and `twine` (default: python)
#
# Versions are held to requirements/test.txt (as constraints), so pip reuses its cache and the
# local torch CPU wheel. Each step prints its duration.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(realpath -s "$(command -v "${1:-python}")")"  # absolute: the steps run elsewhere
WORK="$(mktemp -d "${TMPDIR:-/tmp}/aikit-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export TF_CPP_MIN_LOG_LEVEL=2 MPLBACKEND=Agg PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1
unset PYTHONPATH
DIST=aikit-elastic  # the name on the package index; the import name is aikit (README.md says why)

cpu_now() {  # CPU_NOW: CPU seconds of this script's finished children (wall time on a loaded machine misleads)
    local user system
    times >"$WORK/times"  # in this shell: in a subshell (a pipe, $(...)) these children would not count
    read -r user system <<<"$(tail -1 "$WORK/times" | sed 's/m/ /g; s/s//g' | awk '{ print $1 * 60 + $2, $3 * 60 + $4 }')"
    CPU_NOW=$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%d", u + s }')
}

step() {  # step NAME COMMAND...: run it, print how long it took (wall and CPU)
    local name="$1" start=$SECONDS cpu
    cpu_now
    cpu=$CPU_NOW
    shift
    "$@"
    cpu_now
    echo "wheel test: $name: $((SECONDS - start)) s ($((CPU_NOW - cpu)) s CPU)"
}

fails_naming() {  # fails_naming EXTRA COMMAND...: the command must fail and name `aikit-elastic[EXTRA]`
    local extra="$1" output
    shift
    if output="$("$@" 2>&1)"; then
        echo "expected failure, got success: $*" >&2
        exit 1
    fi
    if ! grep -qF "pip install '$DIST[$extra]'" <<<"$output"; then
        echo "the error of '$*' does not name $DIST[$extra]:" >&2
        tail -5 <<<"$output" >&2
        exit 1
    fi
}

quiet() {  # quiet COMMAND...: its output goes to a log, shown (the end) only when it fails
    local log="$WORK/last.log"
    if ! "$@" >"$log" 2>&1; then
        echo "failed: $*" >&2
        tail -40 "$log" >&2
        exit 1
    fi
}

build() {
    quiet "$PY" -m build --outdir "$WORK/dist" "$ROOT"
    "$PY" -m twine check --strict "$WORK"/dist/*
}

make_env() {  # make_env NAME SPEC [FIRST]: a fresh virtual environment with the wheel installed as SPEC,
    # after FIRST (what the user had installed before aikit, e.g. their TensorFlow build)
    "$PY" -m venv "$WORK/$1"
    if [[ -n "${3:-}" ]]; then
        quiet "$WORK/$1/bin/python" -m pip install --no-compile -c "$ROOT/requirements/test.txt" "$3"
    fi
    quiet "$WORK/$1/bin/python" -m pip install --no-compile -c "$ROOT/requirements/test.txt" "$2"
}

one_tensorflow() {  # the environment holds one TensorFlow distribution, never tensorflow beside tensorflow-cpu
    local found
    found="$("$WORK/$1/bin/python" -m pip list --format=freeze | grep -iE '^tensorflow([-_]cpu)?==' || true)"
    if [[ "$(grep -c . <<<"$found")" != 1 ]]; then
        echo "expected one TensorFlow distribution in $1, found: ${found:-none}" >&2
        exit 1
    fi
    echo "wheel test: $1: one TensorFlow: $found"
}

tf_extras() {  # the wheel's metadata: tf brings tensorflow, tf-cpu tensorflow-cpu, nothing else any TensorFlow
    local requires
    requires="$("$PY" -c 'import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
metadata = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
print(wheel.read(metadata).decode())' "$WHEEL" | grep -iE '^Requires-Dist: tensorflow')"
    [[ "$requires" == $'Requires-Dist: tensorflow>=2.16; extra == "tf"\nRequires-Dist: tensorflow-cpu>=2.16; extra == "tf-cpu"' ]] \
        || { echo "the wheel's TensorFlow requirements are not tf: tensorflow, tf-cpu: tensorflow-cpu:" >&2; echo "$requires" >&2; exit 1; }
}

installed_check() {  # the environment's aikit is the wheel's (the distribution $DIST), not the checkout's
    local bin="$WORK/$1/bin" where
    where="$("$bin/python" -c 'import aikit; print(aikit.__file__)')"
    [[ "$where" == "$WORK/$1/"* ]] || { echo "aikit imported from $where, not from $WORK/$1" >&2; exit 1; }
    [[ "$("$bin/aikit" --version)" == "aikit $VERSION" ]] || { echo "aikit --version: $("$bin/aikit" --version)" >&2; exit 1; }
    [[ "$("$bin/python" -c 'from importlib.metadata import version; print(version("'"$DIST"'"))')" == "$VERSION" ]] \
        || { echo "the distribution $DIST $VERSION is not installed in $WORK/$1" >&2; exit 1; }
}

cli() {  # every CLI command: in core (the plot refused, naming its extra) and torch (plotted); the CLI is
    # framework-free, so the other environments run one command (their entry point and imports)
    local bin="$WORK/$1/bin"
    quiet "$bin/aikit" plan --global-batch-size 256 --max-device-batch 64
    if [[ "$1" != core && "$1" != torch ]]; then
        return
    fi
    quiet "$bin/aikit" plan --global-batch-size 100 --max-device-batch 30 --gpus 3
    quiet "$bin/aikit" trace make ramp --start 32 --end 256 --steps 50 --multiple-of 32 -o ramp.csv
    quiet "$bin/aikit" trace check ramp.csv --micro-batch 32 --replicas 2 --dataset-size 1000
    if [[ "$1" == core ]]; then
        fails_naming plot "$bin/aikit" trace plot ramp.csv -o ramp.png
    else
        quiet "$bin/aikit" trace plot ramp.csv -o ramp.png --dataset-size 1000
        test -s ramp.png
    fi
}

core() {
    local python="$WORK/core/bin/python"
    fails_naming torch "$python" -c "import aikit.elastic.Torch"
    fails_naming tf "$python" -c "import aikit.elastic.TF"
    fails_naming data "$python" -c "from aikit.datasets import digits; digits()"
    fails_naming lightning "$python" -c "import aikit.integrations.lightning"
    fails_naming huggingface "$python" -c "import aikit.integrations.huggingface"
    fails_naming huggingface "$python" -c "import aikit.integrations.accelerate"
    fails_naming ray "$python" -c "import aikit.integrations.ray"
}

torch_examples() {
    local python="$WORK/torch/bin/python"
    fails_naming tf "$python" -c "import aikit.autolrs.TF"
    quiet "$python" examples/torch_elastic_digits.py --epochs 1
    quiet "$python" examples/variable_train_digits.py --epochs 1 --target 0
    quiet "$python" examples/adaptive_digits.py --epochs 1  # docs/adaptive.md's quick look: no target to miss
    quiet "$python" examples/elastic_resize_digits.py --epochs 1 --target 0 --checkpoint-dir "$WORK/ckpt"
    quiet "$python" examples/lr_finder_digits.py --framework torch --out lr  # 100 iterations: seconds
    quiet "$python" examples/autolrs_digits.py --framework torch --steps 120 --tau 30 --tau-max 30 --trials 3 --out autolrs
    quiet "$python" examples/gpt_stdlib.py --quick --threads 1  # 8 updates of a 31k-parameter GPT
}

tf_examples() {
    local python="$WORK/tf/bin/python"
    fails_naming torch "$python" -c "import aikit.lr_finder.Torch"
    quiet "$python" examples/keras_elastic_digits.py  # exits 1 below 95 % held-out, so it trains its full 15 epochs
    quiet "$python" examples/lr_finder_digits.py --framework keras --out lr
    quiet "$python" examples/adaptive_keras_digits.py --epochs 2 --target 0 --trace adaptive.csv
    quiet "$python" examples/autolrs_digits.py --framework keras --steps 120 --tau 30 --tau-max 30 --trials 3 --out autolrs
}

jax_examples() {  # Keras on JAX as its users install it: the jax extra, no TensorFlow in the environment
    local python="$WORK/jax/bin/python"
    if "$python" -m pip list --format=freeze | grep -iE '^tensorflow'; then
        echo "the jax extra brought TensorFlow" >&2; exit 1
    fi
    KERAS_BACKEND=jax quiet "$python" examples/keras_elastic_digits.py  # exits 1 below 95 % held-out
    KERAS_BACKEND=jax quiet "$python" examples/lr_finder_digits.py --framework keras --out lr
}

integration_examples() {  # each example's quickest mode (tests/integrations cover the other modes)
    local python="$WORK/all/bin/python"
    quiet "$python" -c "import aikit.elastic.Torch, aikit.elastic.TF, aikit.integrations.lightning, aikit.integrations.huggingface, aikit.integrations.accelerate, aikit.integrations.ray"
    quiet "$python" examples/lightning_digits.py --epochs 1
    quiet "$python" examples/huggingface_digits.py --epochs 1
    quiet "$python" examples/accelerate_digits.py --epochs 1 --fits 20
    quiet "$python" examples/ray_elastic_digits.py --epochs 1 --lose-at 3 --target 0  # a local Ray cluster, a worker lost
}

total=$SECONDS
VERSION="$("$PY" -c "import re; print(re.search(r'^__version__ = \"([^\"]+)\"', open('$ROOT/aikit/__init__.py').read(), re.M).group(1))")"
step "build + twine check" build
WHEEL="$WORK/dist/${DIST//-/_}-$VERSION-py3-none-any.whl"  # file names spell the distribution aikit_elastic
[[ -f "$WHEEL" && -f "$WORK/dist/${DIST//-/_}-$VERSION.tar.gz" ]] || { ls "$WORK/dist" >&2; echo "expected $WHEEL and its sdist" >&2; exit 1; }
step "tf and tf-cpu extras in the metadata" tf_extras
mkdir "$WORK/run" && cp -r "$ROOT/examples" "$WORK/run/"  # examples as a user copies them, no checkout around
cd "$WORK/run"
for env in core torch tf jax all; do
    first=""
    case "$env" in
        core) spec="$WHEEL" ;;
        tf) spec="$DIST[tf-cpu] @ file://$WHEEL" first=tensorflow-cpu ;;  # a user who has tensorflow-cpu
        all) spec="$DIST[torch,tf-cpu,lightning,huggingface,ray] @ file://$WHEEL" ;;
        *) spec="$DIST[$env] @ file://$WHEEL" ;;
    esac
    step "$env: fresh venv + pip install" make_env "$env" "$spec" "$first"
    installed_check "$env"
    if [[ "$env" == tf || "$env" == all ]]; then
        one_tensorflow "$env"
    fi
    step "$env: CLI" cli "$env"
done
step "core: missing extras named" core
step "torch: examples" torch_examples
step "tf: examples" tf_examples
step "jax: examples" jax_examples
step "all: integration examples" integration_examples
cpu_now
echo "wheel test: passed in $((SECONDS - total)) s ($CPU_NOW s CPU)"
