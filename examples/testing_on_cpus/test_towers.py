"""Check a training setup on 4 logical CPUs against one device.

python -m pytest -q examples/testing_on_cpus
"""

import keras
import numpy as np
import pytest

import kerastower


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


@pytest.mark.parametrize("towers", [3, 4])
def test_towers_train_the_one_device_model(towers):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 6)).astype("float32")  # uneven last batches
    y = rng.integers(0, 3, size=50)

    plain = build()
    model = kerastower.TowerModel.from_model(build(), towers=towers)
    model.set_weights(plain.get_weights())
    for m in (plain, model):
        m.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    fit = dict(batch_size=7, epochs=2, shuffle=False, verbose=0)
    expected = plain.fit(x, y, **fit).history
    history = model.fit(x, y, **fit).history

    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-5, atol=1e-6)
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
