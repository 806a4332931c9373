"""Which Keras kerastower runs on: Keras 3, or Keras 2.

kerastower follows the rule `tf.keras` follows, so that a `TowerModel` is a
model of the Keras the user's own code builds layers with:

- TensorFlow 2.15 and newer: `tf_keras` (Keras 2) when ``TF_USE_LEGACY_KERAS``
  is ``1`` or ``true``; else the ``keras`` package, Keras 3 from TensorFlow
  2.16;
- TensorFlow 2.12 to 2.15: else the Keras 2 those releases ship, `tf.keras`
  (the public API of the ``keras`` package, ``keras.api._v2.keras``: on
  2.12, ``import keras`` gives the package's internals instead).

The rule itself is `kerastower._installed_keras`'s, which ``kerastower
--version`` applies to package metadata without importing TensorFlow. Keras 3
must run on its TensorFlow backend: another one, set by ``$KERAS_BACKEND`` or
Keras's ``keras.json``, is refused with an `ImportError` that says how to
switch.

`keras` is that module, imported by every kerastower module that uses Keras,
and `KERAS_FAMILY` its major version, 2 or 3. What differs between the two
families is reached through `kerastower._keras_compat` only.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import tensorflow as tf

from kerastower import _installed_keras as installed


def _keras_in_use() -> ModuleType:
    if installed.uses_tf_keras(tf.__version__):
        try:
            import tf_keras
        except ImportError as error:
            raise installed.missing_tf_keras(tf.__version__) from error
        return tf_keras
    try:
        import keras
    except (ImportError, ValueError) as error:
        # Keras 3 imports its backend's package at once: the error names
        # `jax` or `torch`, not the setting that asked for it.
        unsupported = _unsupported_backend()
        if unsupported is None:
            raise
        raise unsupported from error
    if installed.release(keras.__version__) < (3,):
        # What `tf.keras` is, without its lazy loader.
        return importlib.import_module("keras.api._v2.keras")
    unsupported = _unsupported_backend()
    if unsupported is not None:
        raise unsupported
    return keras


def _unsupported_backend() -> ImportError | None:
    """The error to raise unless Keras 3 runs on TensorFlow, naming what set
    its backend (``$KERAS_BACKEND`` or Keras's configuration file)."""
    # Keras 3's configuration: imported before its backend, so there even when
    # the backend's import failed. (`keras.config.backend` is the same
    # function, once Keras is imported.)
    config = sys.modules.get("keras.src.backend.config")
    if config is None or config.backend() == installed.SUPPORTED_BACKEND:
        return None
    if os.environ.get(installed.BACKEND_VARIABLE):
        where = installed.BACKEND_VARIABLE
    else:
        where = os.path.join(config.keras_home(), "keras.json")
    return installed.unsupported_backend(config.backend(), where)


keras = _keras_in_use()
# ``keras.api._v2.keras`` has no ``__version__`` on 2.15: the package's.
KERAS_VERSION: str = (
    getattr(keras, "__version__", None) or importlib.import_module("keras").__version__
)
KERAS_FAMILY: int = installed.release(KERAS_VERSION)[0]
# The distribution that holds it, as pip names it.
KERAS_DISTRIBUTION = "tf_keras" if keras.__name__.startswith("tf_keras") else "keras"


def describe() -> str:
    """``"Keras 3.15.1"``, ``"Keras 2.15.0 (tf.keras)"`` or ``"Keras 2.21.0
    (tf_keras)"``: the Keras in use, for messages and ``--version``."""
    return installed.describe(
        KERAS_VERSION,
        installed.source(KERAS_VERSION, tf_keras=KERAS_DISTRIBUTION == "tf_keras"),
    )


# The class of a model's weights: `keras.Variable` (Keras 3) or
# `tf.Variable` (Keras 2, whose layers make TensorFlow variables).
Variable: type = keras.Variable if KERAS_FAMILY >= 3 else tf.Variable


def is_variable(value) -> bool:
    """Whether `value` is a variable of the Keras in use or of TensorFlow."""
    return isinstance(value, (Variable, tf.Variable))


def is_keras_class(cls: type) -> bool:
    """Whether `cls` is defined by the Keras in use (its distribution)."""
    return cls.__module__.startswith(f"{KERAS_DISTRIBUTION}.")


def new_variable(value, dtype, name: str, trainable: bool = True):
    """A variable of the Keras in use, holding `value`."""
    return Variable(value, dtype=dtype, trainable=trainable, name=name)


def value_of(variable) -> tf.Tensor:
    """The current value of a variable of either family, as a tensor."""
    return tf.convert_to_tensor(variable)
