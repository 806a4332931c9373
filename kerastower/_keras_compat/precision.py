"""Building models in another float dtype, on either Keras family."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kerastower._keras_compat.family import KERAS_FAMILY, keras


@contextlib.contextmanager
def float_dtype(dtype: str) -> Iterator[None]:
    """Builds the models made in the block in `dtype` (floatx and dtype policy).

    Keras 3 keeps both in `keras.config`; Keras 2 keeps floatx in
    `keras.backend` and the policy in `keras.mixed_precision`. Both are
    restored when the block ends, also on an error.

    Args:
        dtype: ``"float64"``, ``"float32"`` or ``"float16"``.
    """
    if KERAS_FAMILY == 2:
        backend = keras.backend
        get_policy = keras.mixed_precision.global_policy
        set_policy = keras.mixed_precision.set_global_policy
    else:
        backend = keras.config
        get_policy, set_policy = (
            keras.config.dtype_policy,
            keras.config.set_dtype_policy,
        )
    floatx, policy = backend.floatx(), get_policy()
    backend.set_floatx(dtype)
    set_policy(dtype)
    try:
        yield
    finally:
        backend.set_floatx(floatx)
        set_policy(policy)
