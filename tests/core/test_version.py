"""The version lives in aikit/__init__.py only: the package metadata and `aikit --version` read it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import aikit

ROOT = Path(__file__).resolve().parents[2]


def test_aikit_version_prints_the_package_version(capsys):
    from aikit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"aikit {aikit.__version__}"


def test_setup_reads_the_same_version():
    done = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip().splitlines()[-1] == aikit.__version__
