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


def assert_same_weights(a, b, rtol=1e-5, atol=1e-6):
    for u, v in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(u, v, rtol=rtol, atol=atol)


def assert_same_history(ha: dict, hb: dict, rtol=1e-5, atol=1e-6):
    assert sorted(ha) == sorted(hb)
    for key in ha:
        np.testing.assert_allclose(ha[key], hb[key], rtol=rtol, atol=atol, err_msg=key)


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
