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
        ("ray", "import aikit.integrations.ray", "needs Ray Train (module 'ray'), which is not installed: "
                                                 "pip install 'aikit-elastic[ray]'"),
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


@pytest.mark.parametrize(("blocked", "code", "message"), [
    ("horovod.torch", "import aikit.elastic.Torch.horovod",
     "aikit.elastic.Torch.horovod needs Horovod (module 'horovod'), which is not installed: build it with "
     "scripts/install_horovod.sh"),
    ("safetensors", "from aikit.elastic.Torch import encoding; encoding._safetensors()",
     "ElasticState's checkpoints (safetensors files) needs safetensors (module 'safetensors'), which is not "
     "installed: pip install 'aikit-elastic[torch]'"),
])
def test_horovod_and_safetensors_are_named_by_the_one_place_too(blocked, code, message):
    done = run(blocked, code)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]


def test_every_extra_optional_names_is_one_setup_py_declares():
    """aikit.optional's table and setup.py's extras say the same: an extra named in a message
    exists, and every extra of a dependency aikit imports is named (docs and dev are tools)."""
    import ast
    from pathlib import Path

    from aikit.optional import EXTRAS, TWIN

    setup = ast.parse((Path(__file__).resolve().parents[2] / "setup.py").read_text())
    call = next(node for node in ast.walk(setup) if isinstance(node, ast.Call)
                and getattr(node.func, "id", "") == "setup")
    extras = next(k.value for k in call.keywords if k.arg == "extras_require")
    declared = {key.value for key in extras.keys}
    named = {extra for _, extra in EXTRAS.values()} | {twin for twin, _ in TWIN.values()}
    assert named <= declared
    assert declared - named == {"docs", "dev"}


def test_no_module_but_optional_turns_a_missing_dependency_into_a_message():
    """``aikit/optional.py`` is the one place that says which extra installs a dependency: no
    other module of aikit catches an ImportError (torch without its distributed part aside)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "aikit"
    catching = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                      if "except ImportError" in path.read_text() or "except ModuleNotFoundError" in path.read_text())
    assert catching == ["core/__init__.py", "optional.py", "runtime/Torch/gradient_sync.py"]
