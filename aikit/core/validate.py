"""Checking the numbers users pass: one helper per kind, each raising the named errors of
:mod:`aikit.core.errors` with the argument's name, what it must be, and the value it got.

A bool is refused wherever a number is wanted (``True`` is an ``int`` to Python, never a batch
size to a user), and so is a string that looks like a number (``"0.5"``): the caller gets an
:class:`~aikit.core.errors.InvalidType`, not a silent conversion.
"""

from __future__ import annotations

import inspect
import math
import operator
import os
from collections.abc import Callable
from numbers import Real
from pathlib import Path

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue


def checked_int(value: object, name: str, low: int, high: int | None, wanted: str, fix: str = "") -> int:
    """``value`` as an int in ``low..high`` (no upper bound when ``high`` is None), or an aikit
    error saying ``{name} must be {wanted}, got {value}`` (and ``; {fix}`` when given):
    :class:`InvalidType` for a bool, a float or any non-integer, :class:`InvalidValue` for an
    integer out of range. Every integer argument aikit reads goes through here."""
    fix = f"; {fix}" if fix else ""
    if isinstance(value, bool):
        raise InvalidType(f"{name} must be {wanted}, got {value!r}{fix}")
    try:
        number = operator.index(value)
    except TypeError:
        raise InvalidType(f"{name} must be {wanted}, got {value!r:.100}{fix}") from None
    if number < low or (high is not None and number > high):
        raise InvalidValue(f"{name} must be {wanted}, got {number}{fix}")
    return number


def positive_int(value: object, name: str) -> int:
    """``value`` as an int >= 1, or an aikit error naming it (bools and floats refused)."""
    return checked_int(value, name, 1, None, "a positive integer")


def non_negative_int(value: object, name: str) -> int:
    """``value`` as an int >= 0 (a count, a seed, an epoch), or an aikit error naming it."""
    return checked_int(value, name, 0, None, "a non-negative integer")


def index_in(value: object, name: str, count: int) -> int:
    """``value`` as an int in ``0..count-1`` (a rank), or an aikit error naming it."""
    return checked_int(value, name, 0, count - 1, f"an integer in 0..{count - 1}")


def checked_float(value: object, name: str, wanted: str, valid: Callable[[float], bool] = math.isfinite,
                  fix: str = "") -> float:
    """``value`` as a float for which ``valid`` holds (by default: finite), or an aikit error
    saying ``{name} must be {wanted}, got {value}`` (and ``; {fix}`` when given):
    :class:`InvalidType` for a bool, a string or any non-real, :class:`InvalidValue` for a real
    number ``valid`` rejects (NaN included)."""
    fix = f"; {fix}" if fix else ""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidType(f"{name} must be {wanted}, got {value!r:.100}{fix}")
    number = float(value)
    if not valid(number):
        raise InvalidValue(f"{name} must be {wanted}, got {value!r}{fix}")
    return number


def positive_float(value: object, name: str) -> float:
    """``value`` as a finite float > 0 (an LR, a duration), or an aikit error naming it."""
    return checked_float(value, name, "a finite number > 0", lambda number: 0 < number < math.inf)


def one_number(value: object, name: str, wanted: str = "one number", verb: str = "return") -> float:
    """What a user's function returned (or, ``verb="be"``, passed), as a float: a real number, or
    a tensor or array holding exactly one (0-d or one element, of any framework: read through
    ``shape`` and ``float()``). :class:`InvalidType` for a string (``"0.5"`` too), None, a bool or
    anything else, :class:`InvalidValue` for a tensor of several elements; each message says
    ``{name} must {verb} {wanted}`` and what it got. NaN and inf pass: what they mean is the
    caller's to say."""
    refused = f"{name} must {verb} {wanted} (a float, or a tensor with one element)"
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise InvalidType(f"{refused}, got {value!r:.100}")
    if isinstance(value, Real):
        return float(value)
    shape, dtype = getattr(value, "shape", None), str(getattr(value, "dtype", ""))
    if shape is None or "bool" in dtype:
        raise InvalidType(f"{refused}, got {type(value).__name__} {value!r:.100}")
    dims = tuple(int(size) for size in shape)
    if math.prod(dims) != 1:
        raise InvalidValue(f"{refused}, got a {type(value).__name__} of shape {dims}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidType(f"{refused}, got {type(value).__name__} {value!r:.100}") from None


def checked_bool(value: object, name: str) -> bool:
    """``value`` as a bool (NumPy's included), or an :class:`InvalidType` naming it: a switch is
    ``True`` or ``False``, never a truthy string or number."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidType(f"{name} must be True or False, got {value!r:.60}")
    return bool(value)


def writable_file(path: str | os.PathLike, fix: str = "give a file name") -> Path:
    """``path`` as a :class:`~pathlib.Path` a file can be written to, or an :class:`InvalidValue`
    saying why not (a folder, or in a folder that does not exist) and ``fix``, before any work is
    done, where ``open()`` would raise ``IsADirectoryError`` or ``FileNotFoundError`` after it."""
    path = Path(path)
    if path.is_dir():
        raise InvalidValue(f"cannot write {path}: it is a folder; {fix}")
    if not path.parent.is_dir():
        raise InvalidValue(f"cannot write {path}: the folder {path.parent} does not exist; create it "
                           f"(mkdir -p {path.parent}) or write elsewhere")
    return path


def checked_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, or an :class:`InvalidValue` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidValue(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r:.100}")
    return value



def callable_with(function: object, name: str, how: str, fix: str, arguments: int = 1, more: bool = False) -> Callable:
    """``function`` if aikit can call it as ``how`` says, with ``arguments`` positional arguments
    (``more``: and the caller's own after them), or an :class:`InvalidType` that says how aikit
    calls it, what the function takes and ``fix``, before it runs (where the call would raise a
    ``TypeError`` from inside aikit, about arguments the user never passed)."""
    if not callable(function):
        raise InvalidType(f"{name} must be a function, called as {how}, got {function!r:.60}: {fix}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin: nothing to read
        return function
    try:
        (signature.bind_partial if more else signature.bind)(*range(arguments))
    except TypeError as error:
        title = getattr(function, "__qualname__", type(function).__name__)
        raise InvalidType(f"{name} is called as {how}, but {title}{signature} cannot be called so ({error}): "
                          f"{fix}") from None
    return function
