"""The original systems' names for aikit's settings, taken at the edge and nowhere below it.

Scripts written for eth-easl's variable batch size, Run:AI's AIkit Elastic and aikit 0.1 pass
settings by the names those systems gave them; aikit's own code, the core first, speaks aikit's
name alone. :data:`ORIGINAL_NAMES` is the one table of those names, and :func:`either` the one way
a public entry point (``CustomSampler``, the trace optimizers, both ``init``, ``fit_trace``,
``AdaptiveSampler``, the Lightning and Hugging Face helpers, the command line) takes a setting by
either name: it returns the value and the name the user wrote, so that a message about the value
names what they wrote. Framework-free.
"""

from __future__ import annotations

from aikit.core.errors import InvalidValue
from aikit.core.validate import positive_int

ORIGINAL_NAMES: dict[str, tuple[str, str]] = {
    # the original's name: (aikit's name, the system whose users write it)
    "minibatch_size": ("micro_batch", "eth-easl"),
    "ref_batchsize": ("ref_batch_size", "eth-easl"),
    "max_gpu_batch_size": ("max_device_batch", "Run:AI's AIkit Elastic"),
    "base_batch": ("ref_batch_size", "aikit 0.1"),
}


def either(alias: str, value: object, alias_value: object, *, flags: bool = False) -> tuple[object, str]:
    """One setting given by aikit's name (``value``) or by the original's ``alias``
    (``alias_value``, a key of :data:`ORIGINAL_NAMES`): the value given (None when neither was)
    and the name written; both given is an :class:`InvalidValue`, even when they agree (one of
    them is a leftover). ``flags``: the names are the command line's (``--micro-batch``)."""
    name, origin = ORIGINAL_NAMES[alias]
    if flags:
        name, alias = (f"--{word.replace('_', '-')}" for word in (name, alias))
    if alias_value is None:
        return value, name
    if value is not None:
        raise InvalidValue(f"{name} and {alias} are one setting ({alias} is {origin}'s name for it): give one, "
                           f"got {name}={value!r:.60} and {alias}={alias_value!r:.60}")
    return alias_value, alias


def max_device_batch_of(max_device_batch: object, max_gpu_batch_size: object = None) -> int:
    """The per-device bound both ``init`` take, by aikit's name or Run:AI's, as a positive int, or
    the error that names the one written (both refused; neither: the argument is required)."""
    value, name = either("max_gpu_batch_size", max_device_batch, max_gpu_batch_size)
    if value is None:
        raise InvalidValue("max_device_batch is required: the most samples one device holds in a micro-batch "
                           "(Run:AI's AIkit Elastic's max_gpu_batch_size, the second argument of init)")
    return positive_int(value, name)
