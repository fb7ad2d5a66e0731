"""float64 where the backend computes it: Keras on JAX without ``jax_enable_x64`` makes every
float64 array float32, so ``keras.config.set_floatx("float64")`` there computes in float32 with
no error (JAX's own warning names ``asarray``, not the setting). aikit warns by name where it
builds a model's state or plans for it."""

from __future__ import annotations

import warnings

from aikit.core.errors import NoFloat64Warning
from aikit.core.skips import user_stacklevel
from aikit.runtime.Keras.backend import keras, seam


def check_float64(user: str, variables=()) -> None:
    """Warn (:class:`~aikit.core.errors.NoFloat64Warning`) when Keras' ``floatx`` or one of
    ``variables`` is float64 but the backend computes it in float32."""
    if seam.computes_float64():
        return
    asked = [name for name, dtype in [("keras.config.floatx()", keras.config.floatx()),
                                      *((f"variable {getattr(v, 'path', v.name)!r}", v.dtype) for v in variables)]
             if keras.backend.standardize_dtype(dtype) == "float64"]
    if asked:
        warnings.warn(NoFloat64Warning(
            f"{user}: {asked[0]} is float64, but Keras on JAX without jax_enable_x64 computes it in float32 (every "
            "float64 array is made float32): call jax.config.update('jax_enable_x64', True), or set "
            "JAX_ENABLE_X64=1, before Keras builds anything; or use float32"), stacklevel=user_stacklevel())
