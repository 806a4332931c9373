"""A plain one-device `keras.Model` as the reference for tower training.

The models, data, comparisons and training runs that the tests share.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from keras_family import KERAS_MINOR, keras

import kerastower
from kerastower.callbacks import GradientAccumulation
from kerastower.testing import float_dtype, reorder_batches

__all__ = ["KERAS_MINOR", "keras"]  # besides what is defined here


def twin(build, towers, **tower_kwargs):
    """Builds a plain model and a TowerModel with identical initial weights."""
    plain = build()
    towered = kerastower.TowerModel.from_model(build(), towers=towers, **tower_kwargs)
    towered.set_weights(plain.get_weights())
    return plain, towered


def max_weight_diff(a: keras.Model, b: keras.Model) -> float:
    """The largest absolute difference between the two models' weights."""
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


# `KERASTOWER_TEST_REORDER=1` simulates a CPU whose float32 rounding differs:
# the one-device model trains on each batch's examples in another order (the
# same math, summed in another order), the towers on the data as given.
REORDER = os.environ.get("KERASTOWER_TEST_REORDER") == "1"


def plain_fit_data(x, y, fit):
    """``(x, y, fit)`` for the one-device model: under `REORDER`, arrays cut in
    order (no shuffle, no validation split) reordered within each batch.

    Datasets, generators and other data come back as given.
    """
    weight = fit.get("sample_weight")
    leaves = [leaf for leaf in tf.nest.flatten((x, y, weight)) if leaf is not None]
    if (
        not REORDER
        or fit.get("shuffle", True)
        or fit.get("validation_split")
        or not all(isinstance(leaf, np.ndarray) for leaf in leaves)
    ):
        return x, y, fit
    x, y, weight = reorder_batches((x, y, weight), fit.get("batch_size") or 32)
    return x, y, fit | dict(sample_weight=weight)


def assert_close(actual, expected, rtol=RTOL, atol=ATOL, err_msg=""):
    """`assert_allclose` at the project's tolerance."""
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)


def assert_same_weights(a, b, rtol=RTOL, atol=ATOL):
    """Every weight of `a` is close to `b`'s."""
    for u, v in zip(a.get_weights(), b.get_weights(), strict=True):
        assert_close(u, v, rtol=rtol, atol=atol)


def assert_same_history(ha: dict, hb: dict, rtol=RTOL, atol=ATOL):
    """Two `History.history` dicts have the same keys and close values."""
    assert sorted(ha) == sorted(hb), (sorted(ha), sorted(hb))
    for key in ha:
        assert_close(ha[key], hb[key], rtol=rtol, atol=atol, err_msg=key)


def fit_twins(build, x, y, compile_kwargs, towers=3, tower_kwargs=None, **fit):
    """Trains a plain model on one device and a TowerModel from the same weights.

    Args:
        build: A function that returns a new, uncompiled `keras.Model`.
        x: The inputs, as `fit` takes them.
        y: The targets, as `fit` takes them (`None` for a dataset).
        compile_kwargs: A function that returns `compile`'s arguments. It is
            called once per model, so that each gets its own optimizer and
            metrics.
        towers: int, the TowerModel's number of towers. Defaults to 3.
        tower_kwargs: dict, more arguments for `TowerModel.from_model`.
            Defaults to none.
        **fit: `fit`'s other arguments (the batch size is global);
            ``shuffle=False`` and ``verbose=0`` unless given.

    Returns:
        ``(plain, towered, (plain_history, towered_history))``, the histories
        as `History.history` dicts.
    """
    plain, towered = twin(build, towers, **(tower_kwargs or {}))
    fit = dict(shuffle=False, verbose=0) | fit
    histories = []
    for model, (xs, ys, kwargs) in (
        (plain, plain_fit_data(x, y, fit)),
        (towered, (x, y, fit)),
    ):
        model.compile(**compile_kwargs())
        histories.append(model.fit(xs, ys, **kwargs).history)
    return plain, towered, tuple(histories)


def fit_and_compare(
    build,
    x,
    y,
    compile_kwargs,
    towers=3,
    evaluate=True,
    rtol=RTOL,
    atol=ATOL,
    **fit,
):
    """`fit_twins`, then asserts that the towers trained the one-device model.

    Compares the histories and the weights and, with `evaluate`, what
    `evaluate` and `predict` return after training on `x` in batches of
    `fit`'s batch size.

    Args:
        build, x, y, compile_kwargs, towers, **fit: As `fit_twins` takes them.
        evaluate: bool, whether to compare `evaluate` and `predict` too.
            Defaults to `True`.
        rtol: float, the relative tolerance. Defaults to `RTOL`.
        atol: float, the absolute tolerance. Defaults to `ATOL`.

    Returns:
        ``(plain, towered, (plain_history, towered_history))``.
    """
    plain, towered, histories = fit_twins(
        build, x, y, compile_kwargs, towers=towers, **fit
    )
    assert_same_history(*histories, atol=atol, rtol=rtol)
    assert_same_weights(plain, towered, atol=atol, rtol=rtol)
    if evaluate:
        batch = fit.get("batch_size", 32)
        a = plain.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
        b = towered.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
        assert a.keys() == b.keys()
        for key in a:
            assert_close(b[key], a[key], atol=atol, rtol=rtol, err_msg=key)
        expected = tf.nest.flatten(plain.predict(x, batch_size=batch, verbose=0))
        got = tf.nest.flatten(towered.predict(x, batch_size=batch, verbose=0))
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert_close(g, e, atol=atol, rtol=rtol)
    return plain, towered, histories


def fit_accumulated_and_plain(
    plain, towered, x, y, steps, batch_size, epochs=2, callbacks=()
):
    """Fits one device on big batches and the towers on accumulated micro-batches.

    `plain` trains on batches of ``steps * batch_size`` examples; `towered`
    on micro-batches of `batch_size` with ``GradientAccumulation(steps)``,
    which should give the same updates. Both models must be compiled.

    Args:
        plain: The compiled one-device `keras.Model`.
        towered: The compiled TowerModel, with `plain`'s initial weights.
        x: The inputs, an array.
        y: The targets, an array.
        steps: int, the micro-batches per update.
        batch_size: int, the global micro-batch size.
        epochs: int, the epochs of both fits. Defaults to 2.
        callbacks: More callbacks for `towered`'s fit. Defaults to none.

    Returns:
        ``(plain_history, towered_history)`` as `History.history` dicts.
    """
    fit = dict(epochs=epochs, shuffle=False, verbose=0)
    big_x, big_y, big_fit = plain_fit_data(
        x, y, fit | dict(batch_size=steps * batch_size)
    )
    big = plain.fit(big_x, big_y, **big_fit)
    accumulated = towered.fit(
        x,
        y,
        batch_size=batch_size,
        callbacks=[GradientAccumulation(steps), *callbacks],
        **fit,
    )
    return big.history, accumulated.history


class Crash(keras.callbacks.Callback):
    """Raises ``RuntimeError("simulated crash")`` as epoch `at` (0-based) begins."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("simulated crash")


def float64():
    """Builds the models made in the block in float64 (floatx and dtype policy)."""
    return float_dtype("float64")


def mlp(inputs=5, hidden=7, outputs=1, seed=0, **dense_kwargs):
    """A two-layer perceptron, its weights drawn from `seed`."""
    keras.utils.set_random_seed(seed)
    x = keras.Input((inputs,))
    h = keras.layers.Dense(hidden, activation="tanh", **dense_kwargs)(x)
    y = keras.layers.Dense(outputs)(h)
    return keras.Model(x, y)


def regression_data(n=23, inputs=5, outputs=1, seed=0):
    """`n` normal float32 inputs and targets."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, inputs)).astype("float32")
    y = rng.normal(size=(n, outputs)).astype("float32")
    return x, y


def padded_sequences(rng: np.random.Generator, n=22, length=7):
    """Token ids padded with 0 after a random length, and per-token tags 0-2.

    Rows hold very different numbers of tokens, and so do the towers.
    """
    x = rng.integers(1, 20, size=(n, length))
    for row in range(n):
        x[row, rng.integers(1, length) :] = 0
    return x, rng.integers(0, 3, size=(n, length))


class TokenAndPosition(keras.layers.Layer):
    """The keras.io Transformer's embedding: a position table gathered once."""

    def __init__(self, length=6, vocab=30, dim=8, **kwargs):
        super().__init__(**kwargs)
        self.length = length
        self.tokens = keras.layers.Embedding(vocab, dim)
        self.positions = keras.layers.Embedding(length, dim)

    def call(self, x):
        return self.tokens(x) + self.positions(tf.range(self.length))


def token_position_model():
    """Six token ids to one number through `TokenAndPosition` (sparse gradients)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    h = TokenAndPosition()(inputs)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(inputs, keras.layers.Dense(1)(h))
