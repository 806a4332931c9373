"""Which compiled losses need their divisors summed over the towers.

An unmasked batch-mean loss weighs each tower by its share of the examples,
known before the towers run; only divisors that depend on every tower's
data (masks, ``ignore_class``, summed sample weights) are summed, which
makes every tower wait for all forward passes. The end-to-end exactness of
all of them is in test_equivalence.py and test_real_world_exactness.py.
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras
from oracle import fit_and_compare, mlp, regression_data

from kerastower import _keras_compat
from kerastower.step.loss_weighting import BATCH_MEAN, SUM, weigh_compiled_losses

Y_TRUE = tf.constant([[0], [2], [1]])
Y_PRED = tf.constant(np.random.default_rng(0).normal(size=(3, 3)), tf.float32)


class RecordingSum:
    def __init__(self):
        self.calls = []

    def __call__(self, values):
        self.calls.append([v.numpy() for v in values])
        return [2.0 * v for v in values]  # as if a second tower held the same


def record(divisor, examples=3.0):
    return (tf.constant(0.5), divisor, tf.constant(examples))


def test_batch_means_and_sums_sum_nothing_over_towers():
    sum_fn = RecordingSum()
    factors = weigh_compiled_losses(
        [record(BATCH_MEAN), record(SUM)], tf.constant(12.0), sum_fn
    )
    assert sum_fn.calls == []
    assert factors[0] is None  # D_i / D == n_i / B: the factor is 1
    assert float(factors[1]) == 4.0  # B / n_i


def test_only_counted_divisors_are_summed():
    sum_fn = RecordingSum()
    divisor = tf.constant(5.0, tf.float64)
    factors = weigh_compiled_losses(
        [record(BATCH_MEAN), record(divisor), record(SUM)], tf.constant(12.0), sum_fn
    )
    assert len(sum_fn.calls) == 1
    np.testing.assert_array_equal(sum_fn.calls[0][0], [5.0])
    assert factors[0] is None
    # (D_i / D) * (B / n_i) with D = 10 from the (recorded) two towers.
    assert float(factors[1]) == pytest.approx(0.5 * 4.0, rel=1e-15)
    assert float(factors[2]) == 4.0


@pytest.mark.parametrize(
    "loss, sample_weight",
    [
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), None),
        (
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            tf.constant([1.0, 0.0, 2.0]),
        ),
        (
            keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"
            ),
            None,
        ),
    ],
    ids=["unmasked", "sample_weight", "mean_with_sample_weight_unweighted"],
)
def test_divisors_proportional_to_examples_are_batch_means(loss, sample_weight):
    assert _keras_compat.loss_divisor(loss, Y_TRUE, Y_PRED, sample_weight) is None


def test_masked_and_weight_summing_divisors_are_counted():
    ignore = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=2
    )
    assert float(_keras_compat.loss_divisor(ignore, Y_TRUE, Y_PRED)) == 2.0

    weighted = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight"
    )
    weights = tf.constant([1.0, 0.0, 2.5])
    assert float(_keras_compat.loss_divisor(weighted, Y_TRUE, Y_PRED, weights)) == 3.5

    masked = tf.identity(Y_PRED)
    _keras_compat.set_keras_mask(masked, tf.constant([True, False, True]))
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert float(_keras_compat.loss_divisor(plain, Y_TRUE, masked)) == 2.0


class HalfSquares(keras.losses.Loss):
    """A `Loss` that overrides `__call__` instead of `call`, as keras.io's
    supervised contrastive learning example does; its `call` raises."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        return 0.5 * tf.reduce_mean(tf.square(y_true - y_pred))


def test_a_loss_overriding_dunder_call_trains_as_one_device():
    # It raised `NotImplementedError` from `Loss.call` once.
    x, y = regression_data(n=23)
    fit_and_compare(
        mlp,
        x,
        y,
        lambda: dict(optimizer=keras.optimizers.SGD(0.1), loss=HalfSquares()),
        towers=3,
        batch_size=5,
        epochs=2,
    )
