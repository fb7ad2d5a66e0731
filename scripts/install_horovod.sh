#!/usr/bin/env bash
# Build and install Horovod 0.28.1 (PyTorch + gloo, + NCCL where CUDA exists) into a virtualenv.
#
#   scripts/install_horovod.sh [PYTHON]        (default: the project's .venv/bin/python)
#
# Why a script: Horovod's last release (0.28.1, June 2023) is sdist-only and its CMake files ask for
# C++14, while torch >= 2.1 headers need C++17. The fix is switching CMAKE_CXX_STANDARD 14 -> 17 in
# CMakeLists.txt and horovod/torch/CMakeLists.txt. MPI and MXNet are left out (gloo launches
# `horovodrun --gloo` without an MPI install). When TensorFlow is installed in the same venv, its part
# is built too, without horovod/tensorflow/xla_mpi_ops.cc: those XLA custom-call ops (GPU-only, for
# XLA-compiled Horovod collectives) include TF headers that TF >= 2.16 no longer ships; the regular TF
# ops build and run against TF 2.21. Set AIKIT_HOROVOD_TENSORFLOW=0 to build PyTorch only.
#
# Cache-friendly: does nothing when `import horovod.torch` (and horovod.tensorflow, when built for TF)
# works and `horovodrun --version` answers. Takes about 3 minutes for PyTorch alone on 2 idle cores,
# about twice that with TensorFlow. Needs cmake, gcc/g++ and pip access to the package registry.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
VERSION=0.28.1
BIN="$(dirname "$PY")"
WITH_TF=0
if [ "${AIKIT_HOROVOD_TENSORFLOW:-1}" = 1 ] && "$PY" -c "import tensorflow" >/dev/null 2>&1; then
    WITH_TF=1
fi
want="import horovod.torch"
[ "$WITH_TF" = 1 ] && want="$want, horovod.tensorflow"

if "$PY" -c "$want" >/dev/null 2>&1 && "$BIN/horovodrun" --version >/dev/null 2>&1; then
    echo "Horovod $("$BIN/horovodrun" --version 2>/dev/null | tail -1) already works in $PY; nothing to do"
    exit 0
fi

for tool in cmake gcc g++; do
    command -v "$tool" >/dev/null || { echo "install_horovod.sh: '$tool' is needed to build Horovod; install it first" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building Horovod $VERSION for $PY in $work (about 3 minutes)"
"$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
src="$work/horovod-$VERSION"

# The build fix: torch >= 2.1 needs C++17.
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/$f"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/$f" \
        || { echo "install_horovod.sh: could not switch $f to C++17; the sdist changed" >&2; exit 1; }
done

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1
if [ "$WITH_TF" = 1 ]; then
    echo "TensorFlow found: building horovod.tensorflow too (without its XLA ops)"
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    export HOROVOD_WITH_TENSORFLOW=1
else
    export HOROVOD_WITHOUT_TENSORFLOW=1
fi
if command -v nvcc >/dev/null && "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "CUDA found: building with NCCL"
    export HOROVOD_GPU_OPERATIONS=NCCL
fi
export MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
"$PY" -m pip install --no-build-isolation --no-cache-dir "$src"

"$PY" -c "$want; import horovod.torch as hvd; assert hvd.gloo_built(), 'Horovod built without gloo'"
"$BIN/horovodrun" --version
echo "Horovod $VERSION installed in $PY"
