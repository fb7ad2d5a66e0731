# Sourced by the other scripts: create .venv (Python 3.11, torch 2.13.0 CPU, TF 2.21, Keras 3.15)
# once, and re-install only when requirements/test.txt or setup.py change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
stamp="$VENV/.aikit-installed"
want="$(cat requirements/test.txt setup.py | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV"
    "$PY" -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing aikit and its pinned test dependencies into $VENV (a few minutes the first time)"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -r requirements/test.txt
    # aikit was installed as the distribution "aikit" before it became "aikit-elastic": in this
    # venv that name can only be ours, and two distributions would both own the `aikit` command
    "$VENV/bin/python" -m pip uninstall --quiet --yes aikit 2>/dev/null || true
    "$VENV/bin/python" -m pip install --quiet --no-deps -e .
    echo "$want" > "$stamp"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
