"""Every random stream a training step draws from, saved and put back in one piece.

A restore (AutoLRS' rollback, an elastic resume) must give dropout, data augmentation and
NumPy/Python draws the same streams they had at the checkpoint, or the resumed run differs.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from aikit.core.errors import InvalidValue


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


def check_state(state: object) -> None:
    """Refuse what :func:`set_state` could not put back, before anything changes: it is tried,
    and the streams as they were are put back whatever happens."""
    if not isinstance(state, dict) or not {"torch", "numpy", "python"} <= set(state):
        raise InvalidValue(f"the checkpoint's random state needs torch, numpy and python streams, got "
                           f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
    now = get_state()
    try:
        set_state(state)
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, OverflowError) as error:
        raise InvalidValue(f"the checkpoint's random state cannot be restored: {error}") from error
    finally:
        set_state(now)
