"""The demo's data: scikit-learn's handwritten digits, shipped with kerastower.

Plain NumPy, for the demo on either backend.
"""

from __future__ import annotations

from importlib import resources

import numpy as np


def load_digits(seed: int = 0, test_size: int = 360):
    """Returns ``(x_train, y_train), (x_test, y_test)`` of handwritten digits.

    The 1,797 8x8 images of scikit-learn's ``load_digits`` (the test set of
    the UCI "Optical Recognition of Handwritten Digits" data, E. Alpaydin and
    C. Kaynak, CC BY 4.0) ship with kerastower as ``digits.npz``, so the demo
    needs neither a download nor scikit-learn. Pixels are scaled from
    ``0..16`` to ``[0, 1]`` and shaped ``(8, 8, 1)``; the order is shuffled
    once with `seed` before the split.

    Args:
        seed: Seed of the shuffle. Defaults to 0.
        test_size: Images held out for testing. Defaults to 360, which leaves
            1,437 for training: 47 batches of 30 and a last one of 27.

    Returns:
        Two ``(images, labels)`` pairs of float32 and int32 arrays.
    """
    with resources.files(__package__).joinpath("digits.npz").open("rb") as file:
        digits = np.load(file)
        images, labels = digits["images"], digits["labels"]
    x = (images / 16.0).astype("float32")[..., None]
    y = labels.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    cut = len(x) - test_size
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def convnet(keras, seed: int = 0, batch_norm: dict | None = None):
    """The demo's convnet for 8x8 digits, seeded, built with `keras`.

    Two 3x3 convolutions, the first followed by `BatchNormalization` (with
    the `batch_norm` arguments) unless `batch_norm` is ``None``, average
    pooling and two dense layers: about 40,000 weights.

    Args:
        keras: The Keras module to build with.
        seed: Seed of the initial weights. Defaults to 0.
        batch_norm: The `BatchNormalization` arguments, or ``None`` for none.
            Defaults to ``None``.

    Returns:
        A plain functional `keras.Model`, not compiled.
    """
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    if batch_norm is not None:
        h = keras.layers.BatchNormalization(**batch_norm)(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.AveragePooling2D(2)(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return keras.Model(inputs, outputs, name="digits_convnet")
