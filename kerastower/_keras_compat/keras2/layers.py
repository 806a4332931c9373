"""Keras 2 layer state in towers: what a tower's forward pass assigns.

Keras 3 runs the towers after the first inside a `keras.StatelessScope`
that holds their assignments (`kerastower._keras_compat.layers`). Keras 2
layers assign TensorFlow variables directly and have no such scope: here a
tower reads and assigns the model's variables as they are, so only models
whose forward pass assigns no weight train exactly on towers. Keras 2's
`BatchNormalization` runs unfused with global moments (`trainer`);
`SpectralNormalization` (`tf_keras` 2.16 and newer; that of Keras 2.13 to
2.15 cannot be traced, on one device either) updates once per step, as on
Keras 3, through ``normalize_weights()``. An activity regularizer's penalty is
already a batch mean in Keras 2 (``Layer._handle_activity_regularization``
divides it by the batch size).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from kerastower._keras_compat.errors import _fail, check_method
from kerastower._keras_compat.family import keras

# Keras 2.13 and newer; Keras 2.12 has no spectral normalisation layer.
# Keras 2.13 to 2.15 assign inside `normalize_weights()`, in a Python `if`
# on a tensor that no trace takes: a `fit` fails on it before the towers.
SPECTRAL_NORMALIZATION: tuple = tuple(
    filter(None, [getattr(keras.layers, "SpectralNormalization", None)])
)


# Keras 2 has no scope that holds a tower's assignments (Keras 3's
# `StatelessScope`): every tower reads and assigns the model's variables.
RECORDS_ASSIGNMENTS = False


@contextlib.contextmanager
def activity_penalties_summed(layers, global_batch) -> Iterator[None]:
    """Nothing to change: Keras 2's activity penalty is a batch mean."""
    del layers, global_batch
    yield


def draws_per_traced_op(layers) -> bool:
    """Whether one of `layers` draws random numbers from ops seeded at trace.

    Keras 2's random layers (``BaseRandomLayer``: `Dropout`, the noise and
    augmentation layers) draw through stateful TensorFlow ops whose seed is
    fixed when they are traced: towers that call one traced function would
    all draw tower 0's numbers (the same dropout mask on every tower), so
    such a model traces one copy per tower.
    """
    return any(hasattr(layer, "_random_generator") for layer in layers)


def _check_spectral_normalization(layer) -> None:
    check_method(type(layer), "normalize_weights", ["self"], "SpectralNormalization")
    for name in ("kernel", "vector_u"):
        if not isinstance(getattr(layer, name, None), tf.Variable):
            raise _fail(f"SpectralNormalization.{name}", "is missing")


def spectral_update(layer) -> tuple:
    """The ``(vector_u, kernel)`` that one training call of `layer` assigns.

    `tf_keras`'s `SpectralNormalization` (2.16 and newer) runs, at every
    call with ``training=True``, a power iteration (``normalize_weights()``,
    which returns ``(kernel / sigma, vector_u)``) and assigns both before
    calling the wrapped layer; a kernel of zeros is kept as it is.
    """
    _check_spectral_normalization(layer)
    kernel, vector_u = tf.cond(
        tf.reduce_all(tf.equal(layer.kernel, 0)),
        lambda: (tf.identity(layer.kernel), tf.identity(layer.vector_u)),
        lambda: type(layer).normalize_weights(layer),
    )
    return vector_u, kernel


def freeze_spectral_update(layer) -> None:
    """Makes `layer`'s training calls assign its current values; undo with
    `restore_spectral_update`."""
    _check_spectral_normalization(layer)
    layer.normalize_weights = lambda: (
        tf.identity(layer.kernel),
        tf.identity(layer.vector_u),
    )


def restore_spectral_update(layer) -> None:
    """Undoes `freeze_spectral_update`."""
    vars(layer).pop("normalize_weights", None)
