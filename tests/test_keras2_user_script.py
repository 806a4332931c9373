"""A Keras 2 user's script runs unchanged on `TowerModel` (issue 30).

Written as a `tf.keras` script is: `from tensorflow import keras`, a
functional model, `compile`, and `fit` with an uneven last batch on 3 towers,
`ChiefCheckpoint` and `GradientAccumulation`. `tf.keras` is the Keras
kerastower runs on in either family (Keras 2 on TensorFlow 2.12 to 2.15 or
under ``TF_USE_LEGACY_KERAS=1``, Keras 3 otherwise), so the script runs on
both, and must equal one device with the accumulated batch.
"""

import numpy as np
from oracle import assert_same_history, assert_same_weights
from tensorflow import keras

import kerastower
from kerastower._keras_compat.family import keras as keras_in_use


def build(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return inputs, keras.layers.Dense(3)(hidden)


def test_the_script_runs_unchanged_and_equals_one_device(tmp_path):
    assert keras.Model is keras_in_use.Model  # tf.keras is kerastower's Keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 6)).astype("float32")
    y = rng.integers(0, 3, size=(23,))

    def compile_(model):
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    plain = compile_(keras.Model(*build()))
    # Windows of 2 micro-batches of 6: 12 and 11 examples, one device's
    # batches of 12; the last micro-batch, 5 examples, leaves 3 towers uneven.
    expected = plain.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)

    model = compile_(kerastower.TowerModel(*build(), towers=3))
    checkpoint = kerastower.callbacks.ChiefCheckpoint(
        str(tmp_path / "ckpt-{epoch:02d}.weights.h5"), save_weights_only=True
    )
    history = model.fit(
        x,
        y,
        batch_size=6,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[kerastower.callbacks.GradientAccumulation(2), checkpoint],
    )
    assert_same_weights(plain, model)
    assert_same_history(expected.history, history.history)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["ckpt-01.weights.h5", "ckpt-02.weights.h5"]
    restored = compile_(kerastower.TowerModel(*build(seed=1), towers=3))
    restored.load_weights(str(tmp_path / "ckpt-02.weights.h5"))
    assert_same_weights(model, restored, rtol=0, atol=0)
