"""Which Keras kerastower runs on, decided without importing TensorFlow.

The rule (the one `tf.keras` follows) lives here, in plain Python, so that
`kerastower._keras_compat.family` applies it to the TensorFlow and Keras it
imports and ``kerastower --version`` applies it to the versions that package
metadata names, without the seconds that importing TensorFlow takes:

- TensorFlow 2.15 and newer: `tf_keras` (Keras 2) when ``TF_USE_LEGACY_KERAS``
  is ``1`` or ``true``;
- else the ``keras`` package: Keras 3, or on TensorFlow 2.12 to 2.15 the
  Keras 2 those releases ship as `tf.keras`.

Keras 3 runs on its TensorFlow backend, or on JAX (`backend` says which):
`check_backend_variable` refuses another one before Keras is imported,
`family` the one Keras then runs on (set in Keras's ``keras.json``), both with
`unsupported_backend`'s error.
"""

from __future__ import annotations

import json
import os
import re
from importlib import metadata

# `tf.keras` reads the same variable with the same values (TensorFlow's
# `_KerasLazyLoader`).
LEGACY_VARIABLE = "TF_USE_LEGACY_KERAS"
_LEGACY_VALUES = ("true", "True", "1")
BACKEND_VARIABLE = "KERAS_BACKEND"
SUPPORTED_BACKEND = "tensorflow"
JAX_BACKEND = "jax"
SUPPORTED_BACKENDS = (SUPPORTED_BACKEND, JAX_BACKEND)
# The distributions that install the `tensorflow` package, as pip names them.
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-macos",
    "tensorflow-intel",
    "tensorflow-aarch64",
    "tensorflow-rocm",
    "tf-nightly",
    "tf-nightly-cpu",
)


def release(version: str, parts: int = 2) -> tuple[int, ...]:
    """The first `parts` numbers of a version string: ``"2.15.0rc1"`` ->
    ``(2, 15)``; with 3 parts, ``"3.16.0.dev2025"`` -> ``(3, 16, 0)``."""
    numbers = version.split(".")[:parts]
    return tuple(int(re.match(r"\d*", part)[0] or 0) for part in numbers)


def legacy_requested() -> bool:
    """Whether ``$TF_USE_LEGACY_KERAS`` asks `tf.keras` for `tf_keras`."""
    return os.environ.get(LEGACY_VARIABLE) in _LEGACY_VALUES


def uses_tf_keras(tensorflow_version: str) -> bool:
    """Whether kerastower runs on `tf_keras` beside this TensorFlow."""
    return release(tensorflow_version) >= (2, 15) and legacy_requested()


def source(keras_version: str, tf_keras: bool) -> str:
    """Where the Keras of `keras_version` comes from.

    Args:
        keras_version: The version of the Keras in use.
        tf_keras: Whether it is the `tf_keras` package (`uses_tf_keras`).

    Returns:
        ``"tf_keras"``, ``"tf.keras"`` (the Keras 2 of TensorFlow 2.12 to
        2.15) or ``"keras"`` (Keras 3).
    """
    if tf_keras:
        return "tf_keras"
    return "tf.keras" if release(keras_version) < (3,) else "keras"


def describe(keras_version: str, keras_source: str) -> str:
    """``"Keras 3.15.1"``, ``"Keras 2.15.0 (tf.keras)"`` or ``"Keras 2.21.0
    (tf_keras)"``: the Keras in use, for messages and ``--version``."""
    if keras_source == "keras":
        return f"Keras {keras_version}"
    return f"Keras {keras_version} ({keras_source})"


def missing_tf_keras(tensorflow_version: str) -> ImportError:
    """The error for ``TF_USE_LEGACY_KERAS`` without `tf_keras` installed."""
    minor = ".".join(tensorflow_version.split(".")[:2])
    return ImportError(
        f"`{LEGACY_VARIABLE}` asks for Keras 2 through the `tf_keras` package, "
        "which is not installed: install the one of your TensorFlow "
        f"({tensorflow_version}) with `pip install 'tf_keras~={minor}.0'`, or "
        f"unset `{LEGACY_VARIABLE}` for Keras 3."
    )


def unsupported_backend(backend: str, where: str) -> ImportError:
    """The error for Keras 3 set to run on a backend kerastower does not know.

    Args:
        backend: The backend Keras is set to.
        where: What sets it, as the message shows it: ``"KERAS_BACKEND"``,
            or the path of Keras's configuration file.
    """
    if where == BACKEND_VARIABLE:
        fix = (
            f"unset `{BACKEND_VARIABLE}` or set it to '{SUPPORTED_BACKEND}' or "
            f"'{JAX_BACKEND}'. Received: {BACKEND_VARIABLE}={backend!r}"
        )
    else:
        fix = (
            f'set "backend": "{SUPPORTED_BACKEND}" in {where} (or '
            f"`{BACKEND_VARIABLE}={SUPPORTED_BACKEND}` in the environment). "
            f"Received: backend={backend!r} in {where}"
        )
    return ImportError(
        "kerastower runs on Keras 3 with the TensorFlow or JAX backend, or on "
        f"Keras 2 (tf.keras or tf_keras), not on Keras's {backend!r} backend: {fix}"
    )


def check_backend_variable() -> None:
    """Fails early when ``$KERAS_BACKEND`` sets Keras 3 to another backend.

    Checked before TensorFlow is imported, which imports Keras: on a backend
    whose package is missing, that import fails naming the package (``jax``),
    not the setting; on an unknown one, with Keras's own ``ValueError``. An
    empty ``$KERAS_BACKEND`` is unset, as Keras reads it; Keras 2 has only
    the TensorFlow backend and ignores the variable.

    Without the variable, the ``"backend"`` of Keras's configuration file
    (``$KERAS_HOME/keras.json``, by default ``~/.keras/keras.json``) is
    checked the same way.

    Raises:
        ImportError: If ``$KERAS_BACKEND`` or the configuration file names a
            backend other than TensorFlow or JAX and kerastower would run on
            Keras 3.
    """
    requested, where = _requested_backend()
    if requested and requested not in SUPPORTED_BACKENDS and _runs_keras_3():
        raise unsupported_backend(requested, where)


def backend() -> str:
    """The backend kerastower runs on: ``"jax"`` or ``"tensorflow"``.

    ``"jax"`` where ``$KERAS_BACKEND`` (else Keras's ``keras.json``) names it
    and the Keras in use is Keras 3; ``"tensorflow"`` otherwise, Keras 2
    included, which has no other backend.
    """
    requested, _ = _requested_backend()
    if requested == JAX_BACKEND and _runs_keras_3():
        return JAX_BACKEND
    return SUPPORTED_BACKEND


def _runs_keras_3() -> bool:
    """Whether the Keras in use is Keras 3 (its backend setting counts)."""
    tensorflow_version = installed_version(*TENSORFLOW_DISTRIBUTIONS)
    if tensorflow_version is not None and uses_tf_keras(tensorflow_version):
        return False
    keras_version = installed_version("keras")
    return keras_version is None or release(keras_version) >= (3,)


def _requested_backend() -> tuple[str | None, str]:
    """The backend ``$KERAS_BACKEND`` names, else ``keras.json``, and which."""
    requested = os.environ.get(BACKEND_VARIABLE)
    if requested:
        return requested, BACKEND_VARIABLE
    return _configured_backend()


def _configured_backend() -> tuple[str | None, str]:
    """The backend Keras 3's ``keras.json`` names, and the file's path.

    Keras reads ``$KERAS_HOME``, else ``~/.keras`` (``/tmp/.keras`` when the
    home directory cannot be written).
    """
    home = os.environ.get("KERAS_HOME")
    if not home:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    path = os.path.join(home, "keras.json")
    try:
        with open(path) as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        return None, path
    return (backend if isinstance(backend, str) else None), path


def installed_version(*distributions: str) -> str | None:
    """The version of the first of `distributions` that is installed, if any."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> tuple[str, str] | None:
    """TensorFlow's version and the Keras kerastower would run on beside it.

    Read from package metadata, without importing either.

    Returns:
        ``(tensorflow_version, keras_description)`` as ``("2.15.1", "Keras
        2.15.0 (tf.keras)")``, the description as `describe` writes it; or
        ``None`` when the metadata does not say (TensorFlow built from source,
        or `tf_keras` asked for but not installed).
    """
    tensorflow_version = installed_version(*TENSORFLOW_DISTRIBUTIONS)
    if tensorflow_version is None:
        return None
    tf_keras = uses_tf_keras(tensorflow_version)
    keras_version = installed_version("tf_keras" if tf_keras else "keras")
    if keras_version is None:
        return None
    return tensorflow_version, describe(keras_version, source(keras_version, tf_keras))


def check_tensorflow_backend(module: str, on_jax: str) -> None:
    """Fails the import of a TensorFlow-only `module` when Keras runs on JAX.

    Args:
        module: The module's public name (``"kerastower.callbacks"``).
        on_jax: What to use instead on JAX, for the message.

    Raises:
        ImportError: If kerastower runs on Keras's JAX backend (`backend`).
    """
    if backend() == JAX_BACKEND:
        raise ImportError(
            f"`{module}` runs on Keras's TensorFlow backend, and Keras runs on "
            f"JAX here (KERAS_BACKEND=jax). {on_jax} "
            "(https://kerastower.github.io/kerastower/guides/jax/)"
        )
