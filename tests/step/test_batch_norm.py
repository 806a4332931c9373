"""Synchronised `BatchNormalization` statistics against one device's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kerastower
from kerastower.step.batch_norm import global_moments

X = np.random.default_rng(3).normal(2.0, 0.5, size=(7, 3)).astype("float64")
W = np.random.default_rng(4).normal(size=(3,)).astype("float64")


def statistics_loss(mean, variance):
    # Every order of both statistics, and a weighted sum: no symmetry that
    # a wrong gradient could hide behind.
    return tf.reduce_sum(W * mean**2 + W**2 * mean * variance + variance**3)


def one_device():
    """The loss's gradient and the gradient of its squared norm (a gradient
    penalty), on one device with `tf.nn.moments`."""
    x = tf.constant(X)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            mean, variance = tf.nn.moments(x, [0])
            loss = statistics_loss(mean, variance)
        gradient = inner.gradient(loss, x)
        penalty = tf.reduce_sum(gradient**2)
    return gradient.numpy(), outer.gradient(penalty, x).numpy()


@pytest.mark.parametrize("sizes", [(3, 2, 2), (5, 2, 0)], ids=["even", "empty"])
def test_global_moments_differentiate_as_one_device_to_the_second_order(sizes):
    # Every tower adds its share of the loss (the statistics are the whole
    # batch's, the same on every tower) and its rows' share of the penalty;
    # the sums' gradients carry every tower's share to every tower's rows.
    towers = len(sizes)
    strategy = kerastower.TowerStrategy(kerastower.available_devices()[:towers])
    starts = np.cumsum((0,) + sizes)
    shards = [X[starts[i] : starts[i + 1]] for i in range(towers)]

    inputs = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(shards[context.replica_id_in_sync_group])
    )

    @tf.function
    def step(inputs):
        def tower(x):
            with tf.GradientTape() as outer:
                outer.watch(x)
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    mean, variance = global_moments(x, [0])
                    loss = statistics_loss(mean, variance) / towers
                gradient = inner.gradient(loss, x)
                penalty = tf.reduce_sum(gradient**2)
            return gradient, outer.gradient(penalty, x)

        gradients, hessians = strategy.run(tower, args=(inputs,))
        return (
            tf.concat(strategy.experimental_local_results(gradients), 0),
            tf.concat(strategy.experimental_local_results(hessians), 0),
        )

    gradient, second = step(inputs)
    expected_gradient, expected_second = one_device()
    # float64: agreement to rounding, in another order of the sums.
    np.testing.assert_allclose(gradient.numpy(), expected_gradient, rtol=1e-12)
    np.testing.assert_allclose(second.numpy(), expected_second, rtol=1e-11)
