"""A missing optional dependency names the aikit-elastic extra that installs it (aikit.optional).

Each case runs in a fresh interpreter where the dependency is made unimportable
(``sys.modules[name] = None``, which is what ``import`` sees when a package is absent).
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(blocked: str, code: str) -> subprocess.CompletedProcess:
    script = f"import sys\nsys.modules[{blocked!r}] = None\n{code}"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("blocked", "code", "message"),
    [
        ("torch", "import aikit.elastic.Torch", "this part of aikit needs PyTorch (module 'torch'), which is not "
                                                "installed: pip install 'aikit-elastic[torch]'"),
        ("torch", "import aikit.lr_finder.Torch", "pip install 'aikit-elastic[torch]'"),
        ("tensorflow", "import aikit.autolrs.TF", "needs TensorFlow (module 'tensorflow'), which is not installed: "
                                                  "pip install 'aikit-elastic[tf]' (or 'aikit-elastic[tf-cpu]' for "
                                                  "TensorFlow's CPU-only build, tensorflow-cpu)"),
        ("sklearn", "from aikit.datasets import digits; digits()",
         "aikit.datasets needs scikit-learn (module 'sklearn'), which is not installed: "
         "pip install 'aikit-elastic[data]'"),
        ("lightning", "import aikit.integrations.lightning", "pip install 'aikit-elastic[lightning]'"),
        ("transformers", "import aikit.integrations.huggingface", "pip install 'aikit-elastic[huggingface]'"),
    ],
)
def test_a_missing_dependency_names_its_extra(blocked, code, message):
    done = run(blocked, code)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]


def test_the_cli_names_the_plot_extra(tmp_path):
    code = (
        "from aikit.cli import main\n"
        f"main(['trace', 'make', 'constant', '--start', '32', '--steps', '5', '-o', {str(tmp_path / 't.csv')!r}])\n"
        f"sys.exit(main(['trace', 'plot', {str(tmp_path / 't.csv')!r}, '-o', {str(tmp_path / 't.png')!r}]))"
    )
    done = run("matplotlib", code)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "aikit: error: aikit trace plot needs matplotlib (module 'matplotlib'), which is not installed: "
        "pip install 'aikit-elastic[plot]'"
    )


def test_a_broken_installation_is_not_blamed_on_a_missing_extra():
    """matplotlib is there but one of its own imports is not: reinstalling aikit-elastic[plot] would not
    help, so the original error comes through unchanged."""
    done = run("pyparsing", "from aikit.optional import require; require('matplotlib.pyplot', 'a plot')")
    assert "ModuleNotFoundError: import of pyparsing halted; None in sys.modules" in done.stderr
    assert "aikit-elastic[plot]" not in done.stderr


def test_the_install_lines_name_the_distribution_setup_py_builds():
    """``aikit`` on the package index is an unrelated project: every install line aikit prints
    must name the distribution setup.py builds."""
    from pathlib import Path

    from aikit.optional import DISTRIBUTION

    setup = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    assert f'name="{DISTRIBUTION}",' in setup
    assert DISTRIBUTION == "aikit-elastic"
