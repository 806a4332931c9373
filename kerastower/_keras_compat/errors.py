"""Errors for Keras hooks that changed, and the supported Keras range."""

from __future__ import annotations

import inspect
import warnings

from kerastower import _installed_keras as installed
from kerastower._errors import KerasCompatibilityError
from kerastower._keras_compat.family import KERAS_VERSION

# Keras 3, the newest TensorFlow with it.
SUPPORTED_KERAS = ">=3.8,<3.16"
SUPPORTED_TENSORFLOW = ">=2.16.2,<2.22"
_KERAS_RANGE = ((3, 8), (3, 16))
_TENSORFLOW_RANGE = ((2, 16, 2), (2, 22))
# Keras 2: the `keras` 2.12 to 2.15 that TensorFlow 2.12 to 2.15 ship as
# `tf.keras`, and `tf_keras` 2.16 to 2.21 beside the TensorFlow of its own
# minor version.
SUPPORTED_KERAS_2 = ">=2.12,<2.22"
SUPPORTED_TENSORFLOW_2 = ">=2.12,<2.22"
_KERAS_2_RANGE = ((2, 12), (2, 22))
_TENSORFLOW_2_RANGE = ((2, 12), (2, 22))
INSTALLATION = "https://kerastower.github.io/kerastower/installation/"

_MISSING = object()


def _fail(hook: str, detail: str) -> KerasCompatibilityError:
    return KerasCompatibilityError(
        f"kerastower needs the Keras hook `{hook}`, which {detail} in the "
        f"installed Keras {KERAS_VERSION}; kerastower supports Keras "
        f"{SUPPORTED_KERAS if KERAS_MINOR[0] >= 3 else SUPPORTED_KERAS_2}. "
        "Install a supported Keras, or report this."
    )


def _fail_tensorflow(hook: str, detail: str) -> KerasCompatibilityError:
    import tensorflow as tf

    return KerasCompatibilityError(
        f"kerastower needs the TensorFlow hook `{hook}`, which {detail} in the "
        f"installed TensorFlow {tf.__version__}; kerastower supports TensorFlow "
        f"{SUPPORTED_TENSORFLOW}. Install a supported TensorFlow, or report this."
    )


def check_method(
    owner,
    name: str,
    parameters: list[str],
    shown: str,
    detail: str = "is missing or changed",
) -> None:
    """Fails unless ``owner.name`` is a method whose parameters are `parameters`.

    Args:
        owner: The class (or object) that holds the hook.
        name: The hook's name.
        parameters: Its parameter names in order, ``"self"`` first.
        shown: How the error names `owner` (``"ModelCheckpoint"``).
        detail: What the error says of the hook.

    Raises:
        KerasCompatibilityError: If the hook is missing or takes other parameters.
    """
    method = getattr(owner, name, None)
    if not callable(method) or list(inspect.signature(method).parameters) != parameters:
        raise _fail(f"{shown}.{name}({', '.join(parameters[1:])})", detail)


def check_callables(owner, names, shown: str) -> None:
    """Fails unless every one of `names` is a callable attribute of `owner`.

    Raises:
        KerasCompatibilityError: Naming the first missing hook as
            ``shown.name``.
    """
    for name in names:
        if not callable(getattr(owner, name, None)):
            raise _fail(f"{shown}.{name}", "is missing")


def _attribute(obj, name: str, owner: str, fail=_fail):
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        raise fail(f"{owner}.{name}", "is missing")
    return value


def check_installed(keras_version: str, tensorflow_version: str) -> None:
    """Raises for a Keras or TensorFlow older than supported; warns if newer.

    Args:
        keras_version: The ``__version__`` of the Keras in use (`keras`, or
            `tf_keras` under ``TF_USE_LEGACY_KERAS``).
        tensorflow_version: The installed TensorFlow's ``__version__``.

    Raises:
        KerasCompatibilityError: For Keras 2 older than 2.12 or a `tf_keras`
            of another TensorFlow release than the installed one, Keras 3
            older than 3.8, or a TensorFlow older than the family supports.
    """
    keras_release = installed.release(keras_version, parts=3)
    tensorflow_release = installed.release(tensorflow_version, parts=3)
    if keras_release[0] < 3:
        _check_keras_2(keras_version, tensorflow_version)
        return
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


def _check_keras_2(keras_version: str, tensorflow_version: str) -> None:
    keras_release = installed.release(keras_version)
    tensorflow_release = installed.release(tensorflow_version)
    if keras_release < _KERAS_2_RANGE[0] or tensorflow_release < _TENSORFLOW_2_RANGE[0]:
        raise KerasCompatibilityError(
            f"kerastower supports Keras 2 {SUPPORTED_KERAS_2} with TensorFlow "
            f"{SUPPORTED_TENSORFLOW_2} (the Keras 2 of TensorFlow 2.12 or newer): "
            f"upgrade TensorFlow; see {INSTALLATION}. Received: "
            f"keras=={keras_version}, tensorflow=={tensorflow_version}"
        )
    if keras_release != tensorflow_release:
        raise KerasCompatibilityError(
            f"Keras 2 must be the release of the installed TensorFlow "
            f"({tensorflow_version}): install it with `pip install "
            f"'tf_keras~={'.'.join(map(str, tensorflow_release))}.0'`. "
            f"Received: keras=={keras_version}, tensorflow=={tensorflow_version}"
        )
    if keras_release >= _KERAS_2_RANGE[1]:
        warnings.warn(
            f"kerastower is tested with Keras 2 {SUPPORTED_KERAS_2}; "
            f"Keras {keras_version} is newer. Every Keras and TensorFlow hook it "
            "uses is checked, and one that changed raises "
            "`KerasCompatibilityError`; report it.",
            stacklevel=3,
        )


# The installed Keras as ``(major, minor)``, for what differs between releases.
KERAS_MINOR = installed.release(KERAS_VERSION)


def _check_this_process() -> None:
    import tensorflow as tf

    check_installed(KERAS_VERSION, tf.__version__)


_check_this_process()
