"""Optional dependencies: import one, or fail with the ``pip install`` line that brings it.

``import aikit`` needs only NumPy, pandas, SciPy and tqdm; each framework adapter, the embedded
data set, the plots and the trainer integrations need more, declared as extras in ``setup.py``.
A user who installed ``aikit-elastic[tf]`` and imports ``aikit.elastic.Torch`` should read which extra
to add, not a bare ``No module named 'torch'``.
"""

from __future__ import annotations

import importlib
import types

# aikit's name on the package index (the import name stays ``aikit``: ``aikit`` there is another project)
DISTRIBUTION = "aikit-elastic"

# module -> (what it is, the aikit extra that installs it)
EXTRAS = {
    "torch": ("PyTorch", "torch"),
    "tensorflow": ("TensorFlow", "tf"),
    "keras": ("Keras 3", "tf"),
    "jax": ("JAX", "jax"),
    "sklearn": ("scikit-learn", "data"),
    "matplotlib": ("matplotlib", "plot"),
    "lightning": ("PyTorch Lightning", "lightning"),
    "transformers": ("Hugging Face Transformers", "huggingface"),
    "accelerate": ("Hugging Face Accelerate", "huggingface"),
    "ray": ("Ray Train", "ray"),
    "torchft": ("TorchFT", "torchft"),
    "safetensors": ("safetensors", "torch"),
    "horovod": ("Horovod", "horovod"),
    "torch_xla": ("torch_xla", "xla"),
}
# what installing the extra alone does not do: Horovod's last release builds against torch >= 2.1
# only with a patch, and a framework installed after Horovod is missing from its build
BUILD = {"horovod": "build it with scripts/install_horovod.sh from aikit's repository (Horovod 0.28.1 patched for "
                    "C++17; install the framework first, Horovod builds a part for each framework it finds)"}
# TensorFlow's module comes in several distributions, so as in Hugging Face transformers its extra
# has a CPU-only twin: tf brings `tensorflow`, tf-cpu `tensorflow-cpu` (never both in one environment)
TWIN = {"tf": ("tf-cpu", "TensorFlow's CPU-only build, tensorflow-cpu")}


def require(module: str, user: str, instead: str = "") -> types.ModuleType:
    """Import ``module`` for ``user`` (the aikit part that needs it) and return it.

    A missing module raises ``ModuleNotFoundError`` naming the extra to install (or, for what
    :data:`BUILD` names, how to build it; a part of it that was not built is an ``ImportError``
    saying the same), and ``instead``, what to use in its place, where given; any other import
    error (a broken installation) propagates unchanged, since reinstalling the extra would not fix it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        missing = isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] == top
        if not missing and (isinstance(error, ModuleNotFoundError) or top not in BUILD):
            raise  # the module is there but one of *its* imports is missing, or it is broken
        what, extra = EXTRAS[top]
        how = BUILD.get(top) or f"pip install '{DISTRIBUTION}[{extra}]'{_twin(extra)}"
        state = "is not installed" if missing else f"is installed without it ({error})"
        message = f"{user} needs {what} (module {top!r}), which {state}: {how}{f'; or {instead}' if instead else ''}"
        if missing:
            raise ModuleNotFoundError(message, name=error.name) from error
        raise ImportError(message, name=module) from error


def _twin(extra: str) -> str:
    if extra not in TWIN:
        return ""
    twin, what = TWIN[extra]
    return f" (or '{DISTRIBUTION}[{twin}]' for {what})"


def __getattr__(module: str) -> types.ModuleType:
    """``from aikit.optional import torch``: the framework, or the error naming its extra. The
    framework packages of aikit import theirs this way first."""
    if module in EXTRAS:
        return require(module, "this part of aikit")
    raise AttributeError(f"module 'aikit.optional' has no attribute {module!r}")
