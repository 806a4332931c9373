"""The error of a Keras or TensorFlow that kerastower cannot run on.

Its own module, imported by both backends' fences (`kerastower._keras_compat`
on TensorFlow, `kerastower._keras_compat.jax` on JAX) without either's imports.
"""

from __future__ import annotations

__all__ = ["KerasCompatibilityError"]


class KerasCompatibilityError(RuntimeError):
    """The installed Keras or TensorFlow is one that kerastower cannot run on.

    Raised by ``import kerastower`` for a Keras or TensorFlow outside the
    supported ranges (the message holds the command that installs a
    supported one), and where a private Keras or TensorFlow hook that
    kerastower needs is missing or has changed, naming the hook, so that a
    Keras change gives this error, never a silently different model.
    Importable as ``kerastower.KerasCompatibilityError``.
    """

    __module__ = "kerastower"  # its public home, in tracebacks too

    # Autograph (Keras 2's step functions) re-raises an error raised while
    # tracing as its own type only if it is built like `Exception`; any
    # other becomes a `StagingError`.
    __init__ = Exception.__init__
