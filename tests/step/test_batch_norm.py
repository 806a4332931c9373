"""Synchronised `BatchNormalization` statistics against one device's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kerastower
from kerastower.step.batch_norm import global_moments

W = np.random.default_rng(4).normal(size=(3,)).astype("float64")
# The statistics' axes: the last kept (a Dense layer's, channels last), a
# middle one (channels first) and two kept (Keras 2's `axis=[1, 2]`).
LAYOUTS = {
    "last": ((7, 3), [0]),
    "middle": ((7, 3, 2), [0, 2]),
    "two": ((7, 2, 3), [0]),
}


def activations(shape):
    return np.random.default_rng(3).normal(2.0, 0.5, size=shape).astype("float64")


def statistics_loss(mean, variance):
    # Every order of both statistics, and a weighted sum: no symmetry that
    # a wrong gradient could hide behind.
    return tf.reduce_sum(W * mean**2 + W**2 * mean * variance + variance**3)


def one_device(x, axes):
    """The loss's gradient and the gradient of its squared norm (a gradient
    penalty), on one device with `tf.nn.moments`."""
    x = tf.constant(x)
    with tf.GradientTape() as outer:
        outer.watch(x)
        with tf.GradientTape() as inner:
            inner.watch(x)
            mean, variance = tf.nn.moments(x, axes)
            loss = statistics_loss(mean, variance)
        gradient = inner.gradient(loss, x)
        penalty = tf.reduce_sum(gradient**2)
    return gradient.numpy(), outer.gradient(penalty, x).numpy()


def stacked(values, towers):
    """Every tower's `values`, one row each (a test's gather: each tower
    writes its rows of zeros and the towers sum them, exactly)."""
    context = tf.distribute.get_replica_context()
    row = context.replica_id_in_sync_group
    rows = [
        tf.scatter_nd([[row]], v[tf.newaxis], tf.concat([[towers], tf.shape(v)], 0))
        for v in values
    ]
    return context.all_reduce(tf.distribute.ReduceOp.SUM, rows)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gathers", [False, True], ids=["sums", "gather"])
@pytest.mark.parametrize("sizes", [(3, 2, 2), (5, 2, 0)], ids=["even", "empty"])
def test_global_moments_differentiate_as_one_device_to_the_second_order(
    sizes, gathers, layout
):
    # Every tower adds its share of the loss (the statistics are the whole
    # batch's, the same on every tower) and its rows' share of the penalty;
    # the sums' gradients carry every tower's share to every tower's rows.
    shape, axes = LAYOUTS[layout]
    x_all = activations(shape)
    towers = len(sizes)
    strategy = kerastower.TowerStrategy(kerastower.available_devices()[:towers])
    starts = np.cumsum((0,) + sizes)
    shards = [x_all[starts[i] : starts[i + 1]] for i in range(towers)]

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
                    gather = (lambda v: stacked(v, towers)) if gathers else None
                    mean, variance = global_moments(x, axes, gather=gather)
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
    expected_gradient, expected_second = one_device(x_all, axes)
    # float64: agreement to rounding, in another order of the sums.
    np.testing.assert_allclose(gradient.numpy(), expected_gradient, rtol=1e-12)
    np.testing.assert_allclose(second.numpy(), expected_second, rtol=1e-11)


def test_one_gather_is_as_accurate_as_two_passes_in_float32():
    # Activations whose mean is 100 times their spread: E[x^2] - E[x]^2 (one
    # pass) loses most digits of the variance in float32 (measured 2e-2);
    # the towers' gathered moments (Chan's parallel variance) kept one
    # device's two passes' accuracy (3.4e-7 against 3.1e-7; at 1000 times
    # the spread 9e-6 against 2e-6, where one pass was off by 170%).
    x = np.random.default_rng(5).normal(100.0, 1.0, size=(64, 16, 8))
    truth = x.reshape(-1, 8).var(axis=0)
    x32 = x.astype("float32")
    strategy = kerastower.TowerStrategy(kerastower.available_devices()[:4])
    shards = np.split(x32, 4)
    inputs = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(shards[context.replica_id_in_sync_group])
    )

    @tf.function
    def variances(inputs):
        def tower(x):
            gather = lambda v: stacked(v, 4)  # noqa: E731
            return global_moments(x, [0, 1], gather=gather)[1]

        return strategy.experimental_local_results(strategy.run(tower, (inputs,)))

    flat = x32.reshape(-1, 8)
    one_pass = (flat**2).mean(0) - flat.mean(0) ** 2
    assert np.max(np.abs(one_pass - truth) / truth) > 1e-3  # the failure shown
    for variance in variances(inputs):
        assert np.max(np.abs(variance.numpy() - truth) / truth) < 1e-5
