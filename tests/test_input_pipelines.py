"""The build before the towers draws nothing from the user's input pipeline.

Keras builds a `TowerModel`'s losses and metrics before the first step; it
took a batch from the epoch's iterator to do so, which started a
`keras.utils.PyDataset`'s workers (training began at batch 1: 4.0e-2 from
one device, measured) and consumed one shuffle of `fit(shuffle=True)` (the
batches came in another order than one device's under the same seed:
3.6e-2). The build now reads the batches' specs only, so every pipeline
gives the towers one device's batches in one device's order.
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_2, keras
from oracle import assert_same_history, assert_same_weights, mlp, twin

RNG = np.random.default_rng(3)
X = RNG.normal(size=(37, 5)).astype("float32")
Y = (X @ RNG.normal(size=(5, 1))).astype("float32")
BATCH = 8


class Batches(getattr(keras.utils, "PyDataset", keras.utils.Sequence)):
    """Batches of `X`, `Y` in order, as a `PyDataset` with `workers`."""

    def __init__(self, **kwargs):
        if not KERAS_2:
            super().__init__(**kwargs)

    def __len__(self):
        return -(-len(X) // BATCH)

    def __getitem__(self, index):
        rows = slice(index * BATCH, (index + 1) * BATCH)
        return X[rows], Y[rows]


def generator():
    for _ in range(2):
        for start in range(0, len(X), BATCH):
            yield X[start : start + BATCH], Y[start : start + BATCH]


def inputs(kind):
    """``(data, fit arguments)`` of each kind of input pipeline."""
    if kind == "shuffled arrays":
        return (X, Y), {"batch_size": BATCH, "shuffle": True}
    if kind == "PyDataset with workers":
        if KERAS_2:
            pytest.skip("Keras 2 has no PyDataset")
        return (Batches(workers=2),), {}
    if kind == "generator":
        return (generator(),), {"steps_per_epoch": -(-len(X) // BATCH)}
    dataset = tf.data.Dataset.from_tensor_slices((X, Y))
    return (dataset.shuffle(64, seed=5).batch(BATCH),), {}


@pytest.mark.parametrize(
    "kind", ["shuffled arrays", "PyDataset with workers", "generator", "tf.data"]
)
def test_the_towers_train_on_one_devices_batches(kind):
    plain, towered = twin(mlp, 3)
    histories = []
    for model in (plain, towered):
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
        keras.utils.set_random_seed(11)  # the same shuffles for both
        data, fit = inputs(kind)
        epochs = 1 if kind == "generator" else 2
        histories.append(model.fit(*data, epochs=epochs, verbose=0, **fit).history)
    assert_same_history(*histories)
    assert_same_weights(plain, towered)
