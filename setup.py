import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
# the version lives in aikit/__init__.py only (read, not imported: setup must not need numpy)
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "aikit" / "__init__.py").read_text(), re.M).group(1)

DATA = ["scikit-learn>=1.3"]  # aikit.datasets: the embedded digits
PLOT = ["matplotlib>=3.6"]  # LRFinder.plot, AutoLRS.plot, `aikit trace plot`
TORCH = ["torch>=2.1", "safetensors>=0.4.3"]  # safetensors: ElasticState checkpoints
# TensorFlow is one module shipped by several distributions (tensorflow, tensorflow-cpu, ...); pip
# cannot ask for "any of them", so as Hugging Face transformers does there are two extras: tf brings
# `tensorflow`, tf-cpu the CPU-only `tensorflow-cpu` (an environment that has one keeps it: take the
# extra that names it, or no framework extra and `keras`)
TF = ["tensorflow>=2.16", "keras>=3.3"]
TF_CPU = ["tensorflow-cpu>=2.16", "keras>=3.3"]
# Keras 3 on JAX (KERAS_BACKEND=jax): JAX for CPU, as `pip install jax` brings it (jax[cuda12] for GPUs)
JAX = ["jax>=0.4.34", "keras>=3.8"]
LIGHTNING = ["lightning>=2.2"]
# Trainer needs accelerate; aikit.integrations.accelerate its find_executable_batch_size's reduce_batch_size_fn
# (tested with 1.15.0; the decorator form dropped it before accelerate#4160, aikit calls the direct form)
HUGGINGFACE = ["transformers>=4.46", "accelerate>=1.15"]
# Ray Train v2's elastic workers (ScalingConfig(num_workers=(min, max))) and NO_UPLOAD reports
RAY = ["ray[train]>=2.60"]
# TorchFT's replica groups (aikit.elastic.Torch.fault_tolerance): one release, since its API moves between
# releases; 0.2.0's DistributedDataParallel is not used (aikit sums through Manager.allreduce itself)
TORCHFT = ["torchft==0.2.0"]
DOCS = ["mkdocs>=1.6", "mkdocstrings[python]>=0.26"]

setup(
    # the import name is aikit; on the package index "aikit" is an unrelated AutoML project
    name="aikit-elastic",
    version=VERSION,
    description="Elastic batch sizes for PyTorch and TensorFlow/Keras: plans, gradient "
    "accumulation, batch-size traces, LR range tests and AutoLRS",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["aikit", "aikit.*"]),
    install_requires=["numpy>=1.24", "pandas>=2.0", "scipy>=1.10", "tqdm>=4.60"],
    extras_require={
        # a framework extra brings what its adapters, examples and plots import
        "torch": [*TORCH, *DATA, *PLOT],
        "tf": [*TF, *DATA, *PLOT],
        "tf-cpu": [*TF_CPU, *DATA, *PLOT],
        "jax": [*JAX, *DATA, *PLOT],
        "data": DATA,
        "plot": PLOT,
        "lightning": [*LIGHTNING, *TORCH],
        "huggingface": [*HUGGINGFACE, *TORCH],
        "ray": [*RAY, *TORCH],
        "torchft": [*TORCHFT, *TORCH],
        "horovod": ["horovod==0.28.1"],  # built by scripts/install_horovod.sh (needs a patch)
        "xla": ["torch==2.9.0", "torch_xla==2.9.0"],
        "docs": DOCS,
        "dev": ["pytest>=8", "pytest-xdist>=3", "sybil>=9", "hypothesis>=6.100", "ruff>=0.5", "build>=1.2", "twine>=5",
                *DATA, *PLOT, *DOCS],
    },
    entry_points={"console_scripts": ["aikit=aikit.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: PyTorch",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
