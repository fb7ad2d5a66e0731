from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="aikit",
    version="0.1.0",
    description="Elastic batch sizes for PyTorch and TensorFlow/Keras: plans, gradient "
    "accumulation, batch-size traces, LR range tests and AutoLRS",
    long_description=Path("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["aikit", "aikit.*"]),
    install_requires=["numpy>=1.24", "pandas>=2.0", "scipy>=1.10", "tqdm>=4.60", "matplotlib>=3.6"],
    extras_require={
        "torch": ["torch>=2.1", "safetensors>=0.4.3"],
        "tf": ["tensorflow>=2.16", "keras>=3.3"],
        "horovod": ["horovod==0.28.1"],  # built by scripts/install_horovod.sh (needs a patch)
        "xla": ["torch==2.9.0", "torch_xla==2.9.0"],
        "dev": ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6.100", "ruff>=0.5", "scikit-learn>=1.3"],
    },
    entry_points={"console_scripts": ["aikit=aikit.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: PyTorch",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
