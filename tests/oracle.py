"""A plain one-device `keras.Model` as the reference for tower training."""

from __future__ import annotations

import keras
import numpy as np

import kerastower


def twin(build, towers, **tower_kwargs):
    """Builds a plain model and a TowerModel with identical initial weights."""
    plain = build()
    towered = kerastower.TowerModel.from_model(build(), towers=towers, **tower_kwargs)
    towered.set_weights(plain.get_weights())
    return plain, towered


def max_weight_diff(a: keras.Model, b: keras.Model) -> float:
    return max(
        float(np.max(np.abs(u - v))) if u.size else 0.0
        for u, v in zip(a.get_weights(), b.get_weights(), strict=True)
    )


# The project's tolerance for values computed through towers against one
# device. Towers add the same numbers in another order, so the last float32 bit
# (1.2e-7 relative) depends on the CPU's kernels: never compare at
# `assert_allclose`'s default rtol=1e-7 (tests/test_tolerances.py checks this).
RTOL = 1e-5
ATOL = 1e-6


def assert_close(actual, expected, rtol=RTOL, atol=ATOL, err_msg=""):
    """`assert_allclose` at the project's tolerance."""
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)


def assert_same_weights(a, b, rtol=RTOL, atol=ATOL):
    for u, v in zip(a.get_weights(), b.get_weights(), strict=True):
        assert_close(u, v, rtol=rtol, atol=atol)


def assert_same_history(ha: dict, hb: dict, rtol=RTOL, atol=ATOL):
    assert sorted(ha) == sorted(hb)
    for key in ha:
        assert_close(ha[key], hb[key], rtol=rtol, atol=atol, err_msg=key)


def mlp(inputs=5, hidden=7, outputs=1, seed=0, **dense_kwargs):
    keras.utils.set_random_seed(seed)
    x = keras.Input((inputs,))
    h = keras.layers.Dense(hidden, activation="tanh", **dense_kwargs)(x)
    y = keras.layers.Dense(outputs)(h)
    return keras.Model(x, y)


def regression_data(n=23, inputs=5, outputs=1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    y = rng.normal(size=(n, outputs)).astype("float32")
    return x, y


class TokenAndPosition(keras.layers.Layer):
    """The keras.io Transformer's embedding: a position table gathered once."""

    def __init__(self, length=6, vocab=30, dim=8, **kwargs):
        super().__init__(**kwargs)
        self.length = length
        self.tokens = keras.layers.Embedding(vocab, dim)
        self.positions = keras.layers.Embedding(length, dim)

    def call(self, x):
        return self.tokens(x) + self.positions(keras.ops.arange(self.length))


def token_position_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    h = TokenAndPosition()(inputs)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(inputs, keras.layers.Dense(1)(h))
