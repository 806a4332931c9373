"""Errors for Keras hooks that changed, and the supported Keras range."""

from __future__ import annotations

import re
import warnings

import keras

SUPPORTED_KERAS = ">=3.8,<3.16"
SUPPORTED_TENSORFLOW = ">=2.16.2,<2.22"
_KERAS_RANGE = ((3, 8), (3, 16))
_TENSORFLOW_RANGE = ((2, 16, 2), (2, 22))
INSTALLATION = "https://kerastower.github.io/kerastower/installation/"

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


def _release(version: str) -> tuple[int, ...]:
    """``"3.16.0.dev2025"`` -> ``(3, 16, 0)``."""
    return tuple(int(re.match(r"\d*", part)[0] or 0) for part in version.split(".")[:3])


def check_installed(keras_version: str, tensorflow_version: str) -> None:
    """Raises for a Keras or TensorFlow older than supported; warns if newer.

    Args:
        keras_version: The installed Keras's ``__version__``.
        tensorflow_version: The installed TensorFlow's ``__version__``.

    Raises:
        KerasCompatibilityError: For Keras 2 (TensorFlow 2.15 and older ship
            it), Keras older than 3.8 or TensorFlow older than 2.16.2.
    """
    keras_release = _release(keras_version)
    tensorflow_release = _release(tensorflow_version)
    if keras_release[0] < 3:
        raise KerasCompatibilityError(
            f"kerastower runs on Keras 3 ({SUPPORTED_KERAS}), and `import "
            f"keras` gives Keras {keras_version} (Keras 2, which TensorFlow "
            "2.15 and older ship). Upgrade to TensorFlow 2.16.2 or newer with "
            f"Keras 3; see {INSTALLATION}#on-tensorflow-212-to-215. Received: "
            f"keras=={keras_version}"
        )
    if keras_release[:2] < _KERAS_RANGE[0]:
        raise KerasCompatibilityError(
            f"kerastower supports Keras {SUPPORTED_KERAS}: install one with "
            f"`pip install 'keras{SUPPORTED_KERAS}'`. Received: "
            f"keras=={keras_version}"
        )
    if tensorflow_release < _TENSORFLOW_RANGE[0]:
        raise KerasCompatibilityError(
            f"kerastower supports TensorFlow {SUPPORTED_TENSORFLOW}: install "
            f"one with `pip install 'tensorflow{SUPPORTED_TENSORFLOW}'` (or "
            f"`tensorflow-cpu`). Received: tensorflow=={tensorflow_version}"
        )
    newer = [
        f"{name} {version}"
        for name, version, release, (_, end) in (
            ("Keras", keras_version, keras_release[:2], _KERAS_RANGE),
            ("TensorFlow", tensorflow_version, tensorflow_release, _TENSORFLOW_RANGE),
        )
        if release[:2] >= end
    ]
    if newer:
        warnings.warn(
            f"kerastower is tested with Keras {SUPPORTED_KERAS} and TensorFlow "
            f"{SUPPORTED_TENSORFLOW}; {' and '.join(newer)} is newer. Every "
            "Keras and TensorFlow hook it uses is checked, and one that changed "
            "raises `KerasCompatibilityError`; report it.",
            stacklevel=2,
        )


# The installed Keras as ``(major, minor)``, for what differs between releases.
KERAS_MINOR = _release(keras.__version__)[:2]


def _check_this_process() -> None:
    import tensorflow as tf

    check_installed(keras.__version__, tf.__version__)


_check_this_process()
