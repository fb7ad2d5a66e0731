#!/usr/bin/env bash
# Create .venv-xla: torch_xla 2.9.0 needs exactly torch 2.9.0, which cannot live beside the main
# .venv's torch 2.13.0, so the XLA:CPU test runs in its own virtual environment.
# Does nothing when the environment is already complete (stamp file matches this script).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv-xla"
stamp="$VENV/.aikit-xla-installed"
want="$(cat "${BASH_SOURCE[0]}" setup.py | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
echo "creating $VENV with torch 2.9.0 + torch_xla 2.9.0 (~3 GB, a minute or two the first time)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet torch==2.9.0 torch_xla==2.9.0 \
    numpy==2.4.6 pandas==3.1.1 scipy==1.17.1 tqdm==4.70.1 pytest==9.2.0 hypothesis==6.170.15
"$VENV/bin/python" -m pip uninstall --quiet --yes aikit 2>/dev/null || true  # installed as "aikit" before "aikit-elastic"
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
"$VENV/bin/python" -c "import torch_xla, torch; print('torch', torch.__version__, 'torch_xla', torch_xla.__version__)"
echo "$want" > "$stamp"
