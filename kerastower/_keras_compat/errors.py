"""Errors for Keras hooks that changed, and the supported Keras range."""

from __future__ import annotations

import keras

SUPPORTED_KERAS = ">=3.14,<3.16"
SUPPORTED_TENSORFLOW = ">=2.16.2,<2.22"

_MISSING = object()


class KerasCompatibilityError(RuntimeError):
    """A private Keras hook that kerastower needs is missing or has changed."""


def _fail(hook: str, detail: str) -> KerasCompatibilityError:
    return KerasCompatibilityError(
        f"kerastower needs the Keras hook `{hook}`, which {detail} in the "
        f"installed Keras {keras.__version__}; kerastower supports Keras "
        f"{SUPPORTED_KERAS}. Install a supported Keras, or report this."
    )


def _fail_tensorflow(hook: str, detail: str) -> KerasCompatibilityError:
    import tensorflow as tf

    return KerasCompatibilityError(
        f"kerastower needs the TensorFlow hook `{hook}`, which {detail} in the "
        f"installed TensorFlow {tf.__version__}; kerastower supports TensorFlow "
        f"{SUPPORTED_TENSORFLOW}. Install a supported TensorFlow, or report this."
    )


def _attribute(obj, name: str, owner: str, fail=_fail):
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        raise fail(f"{owner}.{name}", "is missing")
    return value
