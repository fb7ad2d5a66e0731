#!/usr/bin/env bash
# The whole test suite from nothing: set up .venv, lint, then run every test.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ruff check .
python -m pytest "$@"
