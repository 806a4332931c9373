"""Unseeded Keras random ops in a layer draw from Keras's global generator.

``keras.random.normal(shape)`` without a seed draws from Keras's global
`SeedGenerator`, which Keras keeps per thread and makes at the first draw.
Towers traced one by one run in threads of their own, where each made its
own generator and failed (replicas, XLA per tower, ``global_batch_loss``);
stock `MirroredStrategy` fails on such a layer too. The step shares its
generator with the towers: tower 0 draws one device's numbers, the others
their own, and the generator advances once per step, as on one device.
"""

import random

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_2, keras
from oracle import assert_same_history, assert_same_weights, twin

import kerastower

pytestmark = pytest.mark.skipif(KERAS_2, reason="Keras 2 has no global generator")

ONES = np.ones((3, 12), "float32")


class UnseededNoise(keras.layers.Layer):
    """Adds noise drawn without a seed, in training."""

    def call(self, inputs, training=None):
        if not training:
            return inputs
        return inputs + keras.random.normal(keras.ops.shape(inputs))


def build(noise=True):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    h = UnseededNoise()(inputs) if noise else inputs
    outputs = keras.layers.Dense(12, use_bias=False, kernel_initializer="identity")(h)
    return keras.Model(inputs, outputs)


def rows_like_the_first(y_true, y_pred):
    del y_true
    same = tf.reduce_all(tf.equal(y_pred, y_pred[:1]), axis=1)
    return tf.cast(same, "float32")


def fit_then_draw(model, jit_compile=False, **kwargs):
    """Fits `model` on `ONES` from a fresh start (no global generator, seed
    0); then what the global generator and Python's `random` give next."""
    keras.utils.clear_session()  # Keras 3.8's `set_random_seed` keeps it
    keras.utils.set_random_seed(0)
    model.compile(
        optimizer="sgd",
        loss="mse",
        metrics=[rows_like_the_first],
        jit_compile=jit_compile,
    )
    history = model.fit(ONES, ONES, verbose=0, shuffle=False, epochs=2, **kwargs)
    return history.history, keras.random.normal((4,)).numpy(), random.random()


@pytest.mark.parametrize("jit_compile", [False, True])
def test_one_tower_draws_one_devices_numbers(jit_compile):
    plain = build()
    expected = fit_then_draw(plain, jit_compile, batch_size=2)
    _, towered = twin(build, towers=1)
    got = fit_then_draw(towered, jit_compile, batch_size=2)
    assert_same_history(got[0], expected[0])
    assert_same_weights(towered, plain)
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[2] == expected[2]


SETTINGS = {
    "traced_once": {},
    "replicas": {"replicate_variables": True},
    "xla": {"jit_compile": True},
    "global_batch_loss": {"global_batch_loss": True},
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_towers_draw_their_own_numbers_from_one_generator(setting):
    kwargs = dict(SETTINGS[setting])
    jit_compile = kwargs.pop("jit_compile", False)
    expected = fit_then_draw(build(), jit_compile, batch_size=3)
    towered = kerastower.TowerModel.from_model(build(), towers=3, **kwargs)
    history, draw, python_draw = fit_then_draw(towered, jit_compile, batch_size=3)
    # One example per tower, the same input: the same noise on every tower
    # would give 1.0.
    assert history["rows_like_the_first"] == [pytest.approx(1 / 3)] * 2
    # The generator was seeded as one device's and advanced once per step.
    np.testing.assert_array_equal(draw, expected[1])
    assert python_draw == expected[2]


@pytest.mark.parametrize("replicate_variables", [False, True])
def test_a_model_without_unseeded_draws_leaves_keras_random_as_it_was(
    replicate_variables,
):
    expected = fit_then_draw(build(noise=False), batch_size=3)
    towered = kerastower.TowerModel.from_model(
        build(noise=False), towers=3, replicate_variables=replicate_variables
    )
    _, draw, python_draw = fit_then_draw(towered, batch_size=3)
    np.testing.assert_array_equal(draw, expected[1])
    assert python_draw == expected[2]
