#!/usr/bin/env bash
# The whole test suite from nothing: set up .venv (torch 2.13.0 CPU, TF 2.21, Keras 3.15), build
# Horovod 0.28.1 into it and .venv-xla (torch 2.9.0 + torch_xla 2.9.0) beside it — each step is
# skipped when already done — then lint, build the docs site in strict mode, test the wheel as
# users install it (scripts/test_wheel.sh: fresh virtual environments, minutes) and run every
# test, every block of README.md and docs/ included (conftest.py). Extra arguments go to pytest,
# and then only lint and pytest run.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash scripts/install_horovod.sh "$VENV/bin/python"
bash scripts/install_xla.sh
export AIKIT_REQUIRE_HOROVOD=1 AIKIT_REQUIRE_XLA=1 AIKIT_REQUIRE_NETNS=1 AIKIT_REQUIRE_RAY=1 AIKIT_REQUIRE_TORCHFT=1  # fail, not skip
ruff check .
if [ "$#" -eq 0 ]; then
    mkdocs build --strict --quiet  # a broken link or API reference fails the run
    bash scripts/test_wheel.sh "$VENV/bin/python"
fi
# two workers (pytest-xdist): the 2-core machine's CPU stays busy while multi-process tests wait on
# their launchers (each launch picks free ports: torchrun --standalone, horovodrun, the tests'
# rendezvous); `-n 0` among the arguments runs everything in this process
python -m pytest -n 2 "$@"
