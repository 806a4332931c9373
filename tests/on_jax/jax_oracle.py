"""The one-device oracle on JAX: a plain `keras.Model` from the same initial
weights, trained on the same batches in the same order.

float64 is the verdict (weights within 1e-12 of the largest weight), except
where Keras itself computes in float32 on JAX: its type promotion gives
``result_type(float64, float32) == float32`` on every backend but TensorFlow,
so `BatchNormalization` and the normalisation layers run in float32 under a
float64 policy. Those tests compare against a yardstick measured in the same
run (`yardstick`): one device fed each batch's rows in reverse order.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np

import kerastower
from kerastower.on_jax import yardstick as yardstick_runs

# float64: the sum of a batch in another order moves the last bits (measured
# up to 2.2e-16 relative after 2 epochs of Adam); 1e-12 leaves room for more
# steps and never lets a real error through.
TOLERANCE = 1e-12


@contextlib.contextmanager
def float64():
    """Builds the block's models in float64 (floatx and the dtype policy)."""
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def twin(build, towers: int | None = 4, **tower_kwargs):
    """``build(cls, **kwargs)`` twice: a plain model and a `TowerModel`, with
    the same initial weights."""
    keras.utils.set_random_seed(0)
    plain = build(keras.Model)
    keras.utils.set_random_seed(0)
    tower = build(kerastower.TowerModel, towers=towers, **tower_kwargs)
    tower.set_weights(plain.get_weights())
    return plain, tower


def fit_both(plain, tower, x, y=None, **fit_kwargs):
    """Both models' `fit` on the same batches (``shuffle=False``): histories."""
    fit_kwargs = {"epochs": 2, "shuffle": False, "verbose": 0, **fit_kwargs}
    return (
        plain.fit(x, y, **fit_kwargs).history,
        tower.fit(x, y, **fit_kwargs).history,
    )


def weights_apart(model, other) -> float:
    """The largest weight difference, relative to the largest weight (at
    least 1)."""
    return yardstick_runs.weights_apart(model, other, floor=1.0)


def assert_same(plain, tower, histories=None, tolerance: float = TOLERANCE):
    """Weights (and histories: same keys, values) within `tolerance`."""
    apart = weights_apart(plain, tower)
    assert apart <= tolerance, f"weights {apart:.3e} apart (> {tolerance:.0e})"
    if histories is not None:
        one, towers = histories
        assert sorted(one) == sorted(towers)
        for key in one:
            np.testing.assert_allclose(
                towers[key], one[key], rtol=tolerance, atol=tolerance
            )


def yardstick(build, x, y, batch_size: int, **fit_kwargs) -> float:
    """How far one device drifts from itself on each batch reversed: the
    float rounding of this machine, for this model and these batches."""
    keras.utils.set_random_seed(0)
    one = build(keras.Model)
    keras.utils.set_random_seed(0)
    other = build(keras.Model)
    other.set_weights(one.get_weights())
    fit_kwargs = {"epochs": 2, "shuffle": False, "verbose": 0, **fit_kwargs}
    one.fit(x, y, batch_size=batch_size, **fit_kwargs)
    xr, yr = yardstick_runs.reversed_batches((x, y), batch_size)
    other.fit(xr, yr, batch_size=batch_size, **fit_kwargs)
    return weights_apart(one, other)


def mlp(cls, optimizer="adam", loss="mse", metrics=("mae",), **kwargs):
    """A two-layer perceptron on 5 features, compiled."""
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(7, activation="tanh")(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    model = cls(inputs, outputs, **kwargs)
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    model.compile(optimizer=optimizer, loss=loss, metrics=list(metrics))
    return model
