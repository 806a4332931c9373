"""Property: every input pipeline gives the towers one device's batches.

Keras builds a `TowerModel`'s losses and metrics before the first step; it
took a batch from the epoch's iterator to do so, which started a
`keras.utils.PyDataset`'s workers (training began at batch 1: 4.0e-2 from
one device, measured) and consumed a shuffle of a shuffled `tf.data`
pipeline (the batches came in another order than one device's under the
same seed). The build now reads the batches' specs only. Drawn: the
pipeline (arrays shuffled by `fit`, a `PyDataset` with workers, a
generator, a shuffled `tf.data.Dataset`), towers, batch size, examples,
replicas.
"""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st
from keras_family import KERAS_2, keras
from oracle import assert_same_history, assert_same_weights, mlp, twin

PIPELINES = ["shuffled arrays", "generator", "tf.data"]
if not KERAS_2:  # Keras 2 has no PyDataset
    PIPELINES.append("PyDataset with workers")


class Batches(getattr(keras.utils, "PyDataset", object)):
    """Batches of `x`, `y` in order, as a `PyDataset` with 2 workers."""

    def __init__(self, x, y, batch_size):
        super().__init__(workers=2)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


def pipeline(kind, x, y, batch_size, epochs):
    """``(data, fit arguments)`` of `kind`, made after the seed is set."""
    if kind == "shuffled arrays":
        return (x, y), {"batch_size": batch_size, "shuffle": True}
    if kind == "PyDataset with workers":
        return (Batches(x, y, batch_size),), {}
    if kind == "generator":

        def batches():
            for _ in range(epochs):
                for start in range(0, len(x), batch_size):
                    yield x[start : start + batch_size], y[start : start + batch_size]

        return (batches(),), {"steps_per_epoch": -(-len(x) // batch_size)}
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=5)
    return (dataset.batch(batch_size),), {}


@st.composite
def setups(draw):
    return dict(
        kind=draw(st.sampled_from(PIPELINES)),
        towers=draw(st.integers(2, 4)),
        batch_size=draw(st.integers(1, 11)),
        samples=draw(st.integers(1, 30)),
        seed=draw(st.integers(0, 2**16)),
        replicas=not KERAS_2 and draw(st.booleans()),
    )


def check(setup):
    rng = np.random.default_rng(setup["seed"])
    x = rng.normal(size=(setup["samples"], 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    plain, towered = twin(mlp, setup["towers"], replicate_variables=setup["replicas"])
    histories = []
    for model in (plain, towered):
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
        keras.utils.set_random_seed(setup["seed"])  # the same shuffles for both
        data, fit = pipeline(setup["kind"], x, y, setup["batch_size"], epochs=2)
        histories.append(model.fit(*data, epochs=2, verbose=0, **fit).history)
    assert_same_history(*histories)
    assert_same_weights(plain, towered)


@given(setups())
def test_every_pipeline_gives_one_devices_batches(setup):
    check(setup)


@pytest.mark.parametrize("kind", PIPELINES)
def test_every_pipeline_is_drawn(kind):
    # The property draws 12 examples: each pipeline runs here whatever it draws.
    check(dict(kind=kind, towers=3, batch_size=8, samples=29, seed=11, replicas=False))
