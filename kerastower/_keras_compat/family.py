"""Which Keras kerastower runs on: Keras 3, or Keras 2.

kerastower follows the rule `tf.keras` follows, so that a `TowerModel` is a
model of the Keras the user's own code builds layers with:

- TensorFlow 2.15 and newer: `tf_keras` (Keras 2) when ``TF_USE_LEGACY_KERAS``
  is ``1`` or ``true``; else the ``keras`` package, Keras 3 from TensorFlow
  2.16;
- TensorFlow 2.12 to 2.15: else the Keras 2 those releases ship, `tf.keras`
  (the public API of the ``keras`` package, ``keras.api._v2.keras``: on
  2.12, ``import keras`` gives the package's internals instead).

`keras` is that module, imported by every kerastower module that uses Keras,
and `KERAS_FAMILY` its major version, 2 or 3. What differs between the two
families is reached through `kerastower._keras_compat` only.
"""

from __future__ import annotations

import importlib
import os
import re
from types import ModuleType

import tensorflow as tf

# `tf.keras` reads the same variable with the same values (TensorFlow's
# `_KerasLazyLoader`).
LEGACY_VARIABLE = "TF_USE_LEGACY_KERAS"
_LEGACY_VALUES = ("true", "True", "1")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(re.match(r"\d*", part)[0] or 0) for part in version.split(".")[:2])


def legacy_requested() -> bool:
    """Whether ``$TF_USE_LEGACY_KERAS`` asks `tf.keras` for `tf_keras`."""
    return os.environ.get(LEGACY_VARIABLE) in _LEGACY_VALUES


def _keras_in_use() -> ModuleType:
    if _release(tf.__version__) >= (2, 15) and legacy_requested():
        try:
            import tf_keras
        except ImportError as error:
            raise ImportError(
                f"`{LEGACY_VARIABLE}` asks for Keras 2 through the `tf_keras` "
                "package, which is not installed: install the one of your "
                f"TensorFlow ({tf.__version__}) with `pip install "
                f"'tf_keras~={'.'.join(tf.__version__.split('.')[:2])}.0'`, or "
                f"unset `{LEGACY_VARIABLE}` for Keras 3."
            ) from error
        return tf_keras
    import keras

    if _release(keras.__version__) < (3,):
        # What `tf.keras` is, without its lazy loader.
        return importlib.import_module("keras.api._v2.keras")
    return keras


keras = _keras_in_use()
# ``keras.api._v2.keras`` has no ``__version__`` on 2.15: the package's.
KERAS_VERSION: str = (
    getattr(keras, "__version__", None) or importlib.import_module("keras").__version__
)
KERAS_FAMILY: int = _release(KERAS_VERSION)[0]
# The distribution that holds it, as pip names it.
KERAS_DISTRIBUTION = "tf_keras" if keras.__name__.startswith("tf_keras") else "keras"


def describe() -> str:
    """``"Keras 3.15.1"``, ``"Keras 2.15.0 (tf.keras)"`` or ``"Keras 2.21.0
    (tf_keras)"``: the Keras in use, for messages and ``--version``."""
    if KERAS_FAMILY >= 3:
        return f"Keras {KERAS_VERSION}"
    source = "tf_keras" if KERAS_DISTRIBUTION == "tf_keras" else "tf.keras"
    return f"Keras {KERAS_VERSION} ({source})"


# The class of a model's weights: `keras.Variable` (Keras 3) or
# `tf.Variable` (Keras 2, whose layers make TensorFlow variables).
Variable: type = keras.Variable if KERAS_FAMILY >= 3 else tf.Variable


def new_variable(value, dtype, name: str, trainable: bool = True):
    """A variable of the Keras in use, holding `value`."""
    return Variable(value, dtype=dtype, trainable=trainable, name=name)


def value_of(variable) -> tf.Tensor:
    """The current value of a variable of either family, as a tensor."""
    return tf.convert_to_tensor(variable)
