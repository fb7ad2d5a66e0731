"""Every random stream a training step draws from, saved and put back in one piece.

A restore (AutoLRS' rollback, an elastic resume) must give dropout, data augmentation and
NumPy/Python draws the same streams they had at the checkpoint, or the resumed run differs.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def get_state() -> dict:
    """The torch (CPU and, once initialised, CUDA), NumPy and Python random states."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_state(state: dict) -> None:
    """Put back what :func:`get_state` saved (CUDA states only for the devices present)."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])
