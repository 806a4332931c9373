"""`BatchNormalization` statistics of the global batch, as one device has them.

While towers train, each `BatchNormalization` layer normalises with the mean
and variance of **all** towers' examples. They are computed in two passes, as
one device's `tf.nn.moments` does, so that they are as accurate:

``mean = sum_i S_i / sum_i C_i``, then
``variance = sum_i Q_i / sum_i C_i`` with ``Q_i = sum (x - mean)^2``,

where ``S_i``, ``C_i`` and ``Q_i`` are tower ``i``'s sum, count and sum of
squared deviations over the reduction axes, each summed over the towers of
every worker with one all-reduce (`kerastower.reduce.towers`). Keras's own
``synchronized=True`` computes ``E[x^2] - E[x]^2`` in one pass instead, which
loses float32 precision where the variance is small against the squared mean
(deep convnets), and it does not synchronise masked inputs at all.

With a Keras mask the counts are those of the unmasked positions, and the
divisions add Keras's ``epsilon()`` to the count, as the layer does on one
device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from kerastower.reduce.towers import sum_over_towers


def global_moments(
    inputs: tf.Tensor,
    axes,
    mask: tf.Tensor | None = None,
    sum_fn: Callable[[Sequence[tf.Tensor]], list[tf.Tensor]] = sum_over_towers,
):
    """The mean and variance of `inputs` over `axes` and over all towers.

    Args:
        inputs: This tower's activations.
        axes: The reduction axes (every axis but the feature axis).
        mask: A Keras mask over the leading axes of `inputs`, or ``None``.
        sum_fn: Sums a list of tensors over every tower (of every worker:
            a `kerastower.reduce.towers.TowerSum`).

    Returns:
        ``(mean, variance)``, squeezed to the feature axis, in the dtype of
        `inputs` (computed in float32 for float16 and bfloat16 inputs).
    """
    dtype = inputs.dtype
    x = tf.cast(inputs, tf.float32) if dtype in (tf.float16, tf.bfloat16) else inputs
    axes = list(axes)
    if mask is None:
        weights = None
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        count = tf.reshape(count, [1] * x.shape.rank)
        total, count = sum_fn([tf.reduce_sum(x, axes, keepdims=True), count])
        divisor = count
    else:
        weights = tf.cast(
            tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype
        )
        total, count = sum_fn(
            [
                tf.reduce_sum(x * weights, axes, keepdims=True),
                tf.reduce_sum(weights, axes, keepdims=True),
            ]
        )
        divisor = count + keras.backend.epsilon()
    mean = tf.math.divide_no_nan(total, divisor)
    deviation = x - tf.stop_gradient(mean) if mask is None else x - mean
    squares = tf.square(deviation)
    if weights is not None:
        squares = squares * weights
    (squared,) = sum_fn([tf.reduce_sum(squares, axes, keepdims=True)])
    variance = tf.math.divide_no_nan(squared, divisor)
    mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    if dtype in (tf.float16, tf.bfloat16):
        mean = tf.cast(tf.clip_by_value(mean, dtype.min, dtype.max), dtype)
        variance = tf.cast(tf.clip_by_value(variance, dtype.min, dtype.max), dtype)
    return mean, variance
