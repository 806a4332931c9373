"""Layer updates that one training step makes once, not once per tower.

`keras.layers.SpectralNormalization` updates its weights in the forward pass:
at every training call it runs a power iteration from its ``vector_u`` and
assigns ``u' = power_iteration(u, W)`` and ``W' = W / sigma(u', W)`` before
the wrapped layer reads ``W'``. On one device a step does this once, and its
gradient is taken at ``W'``. Towers that each ran the update would run it
``N`` times in a row (each tower reading what the previous one assigned), so
``W`` would be divided ``N`` times and ``u`` iterated ``N`` times.

`once_per_step` runs the update once, before the towers, on the model's
variables (and copies ``W'`` to every tower's replica with
``replicate_variables=True``); while the towers run, each such layer assigns
the values it reads, so every tower reads ``W'`` and ``u'`` and takes its
gradient at ``W'``, as one device does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from kerastower import _keras_compat


def spectral_normalizations(model: keras.Model) -> list:
    """The `keras.layers.SpectralNormalization` layers inside `model`."""
    return [
        layer
        for layer in _keras_compat.inner_layers(model)
        if isinstance(layer, keras.layers.SpectralNormalization)
    ]


@contextlib.contextmanager
def once_per_step(model: keras.Model, replicas: Any = None) -> Iterator[None]:
    """Runs the model's forward-pass weight updates once, then freezes them.

    Open it around the towers of a training step.

    Args:
        model: The `kerastower.TowerModel`.
        replicas: The model's `kerastower.replicas.Replicas`, or ``None``.
    """
    layers = spectral_normalizations(model)
    if not layers:
        yield
        return
    trainable = {id(v): j for j, v in enumerate(model.trainable_weights)}
    devices = model.tower_devices
    for layer in layers:
        with tf.device(devices[0]):
            vector_u, kernel = _keras_compat.spectral_update(layer)
        layer.vector_u.assign(vector_u)
        layer.kernel.assign(kernel)
        j = trainable.get(id(layer.kernel))
        if replicas is not None and replicas.built and j is not None:
            for tower in range(1, len(replicas.devices)):
                with tf.device(replicas.devices[tower]):
                    replicas.replica_variables(tower)[j].assign(kernel)
    try:
        for layer in layers:
            _keras_compat.freeze_spectral_update(layer)
        yield
    finally:
        for layer in layers:
            _keras_compat.restore_spectral_update(layer)
