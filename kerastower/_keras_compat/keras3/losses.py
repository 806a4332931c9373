"""Keras's loss reduction and masks, as the tower loss weighting needs them."""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from kerastower._keras_compat.errors import _fail
from kerastower._keras_compat.family import keras

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "get_keras_mask",
    "loss_divisor",
    "set_keras_mask",
]

# Reductions whose one-device value is ``sum(weighted values) / divisor``.
NORMALISED_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def _loss_module():
    try:
        from keras.src.losses import loss as loss_module
    except ImportError as error:  # pragma: no cover - depends on Keras
        raise _fail("keras.src.losses.loss", "cannot be imported") from error
    for name in ("apply_mask", "squeeze_or_expand_to_same_rank"):
        if not callable(getattr(loss_module, name, None)):  # pragma: no cover
            raise _fail(f"keras.src.losses.loss.{name}", "is missing")
    return loss_module


def get_keras_mask(tensor) -> tf.Tensor | None:
    """Returns the Keras mask carried by `tensor` (``_keras_mask``), if any."""
    return getattr(tensor, "_keras_mask", None)


def set_keras_mask(tensor, mask) -> None:
    """Attaches a Keras mask to `tensor`, as Keras's masking layers do."""
    tensor._keras_mask = mask


def divisor(reduction, values, sample_weight=None, mask=None) -> tf.Tensor:
    """The number Keras divides a loss's weighted sum by, for one batch.

    For the reductions in `NORMALISED_REDUCTIONS` Keras computes a loss as
    ``sum(values * sample_weight * mask) / D`` with

    - ``"sum_over_batch_size"`` and ``"mean"``: ``D`` is the number of loss
      elements, or the number of unmasked ones when a mask is present (a
      Keras mask such as ``Embedding(mask_zero=True)``'s, or ``ignore_class``);
    - ``"mean_with_sample_weight"``: ``D`` is the sum of the masked sample
      weights (the number of elements when there are none).

    ``D`` adds up over the shards of a batch, which is what makes towers
    exact (see `kerastower.step.loss_weighting`).

    Args:
        reduction: One of `NORMALISED_REDUCTIONS`.
        values: The per-element losses (what ``Loss.call`` returns).
        sample_weight: The sample weights given to the loss, or ``None``.
        mask: The combined Keras mask of the loss elements, or ``None``.

    Returns:
        A float64 scalar tensor (exact counts past 2**24 elements).
    """
    values = tf.convert_to_tensor(values)
    if reduction == "mean_with_sample_weight" and (
        sample_weight is not None or mask is not None
    ):
        loss_module = _loss_module()
        weights = loss_module.apply_mask(
            None if sample_weight is None else tf.cast(sample_weight, values.dtype),
            mask,
            dtype=values.dtype,
            reduction=reduction,
        )
        _, weights = loss_module.squeeze_or_expand_to_same_rank(values, weights)
        return tf.reduce_sum(tf.cast(weights, tf.float64))
    if mask is not None:
        return tf.reduce_sum(tf.cast(mask, tf.float64))
    return tf.cast(tf.size(values), tf.float64)


def loss_divisor(loss, y_true, y_pred, sample_weight=None) -> tf.Tensor | None:
    """The divisor of `loss` on one batch, or ``None`` for a batch mean.

    Recomputes the loss's per-element values and mask as ``Loss.__call__``
    does (TensorFlow's graph optimiser merges the repeated computation), and
    returns `divisor` of them. ``None`` means the divisor is the batch's
    examples times a number that is the same for every shard of the batch:
    the loss has no per-element values to count (a custom loss whose ``call``
    returns a scalar, a `keras.losses.Loss` that overrides ``__call__``, or
    a callable that is not a `keras.losses.Loss`), or
    it divides by the count of its elements, with no mask and no sample
    weights to sum, which is ``examples * prod(values.shape[1:])``.

    Raises:
        ValueError: If the loss's reduction is one kerastower cannot split
            exactly (``None``/``"none"``, or one newer than this release).
    """
    reduction = getattr(loss, "reduction", "sum_over_batch_size")
    if reduction not in NORMALISED_REDUCTIONS:
        raise ValueError(
            "TowerModel splits compiled losses whose `reduction` is one of "
            f"{('sum',) + NORMALISED_REDUCTIONS}. Received: reduction="
            f"{reduction!r} for loss {getattr(loss, 'name', loss)!r}"
        )
    if (
        not isinstance(loss, keras.losses.Loss)
        or type(loss).__call__ is not keras.losses.Loss.__call__
    ):
        # A `Loss` that overrides `__call__` reduces as it pleases, and its
        # `call` may not exist: it is a callable like any other.
        return None
    check_reductions()
    in_mask = get_keras_mask(y_pred)
    dtype = loss.dtype
    values = tf.convert_to_tensor(
        loss.call(
            tf.nest.map_structure(lambda t: tf.cast(t, dtype), y_true),
            tf.nest.map_structure(lambda t: tf.cast(t, dtype), y_pred),
        ),
        dtype=dtype,
    )
    if values.shape.rank == 0:
        return None
    out_mask = get_keras_mask(values)
    if in_mask is not None and out_mask is not None:
        mask = tf.logical_and(tf.cast(in_mask, tf.bool), tf.cast(out_mask, tf.bool))
    else:
        mask = in_mask if in_mask is not None else out_mask
    if mask is None and (
        reduction != "mean_with_sample_weight" or sample_weight is None
    ):
        return None
    return divisor(reduction, values, sample_weight, mask)


@functools.cache
def check_reductions() -> None:
    """Checks `divisor` against Keras's own loss reduction, once.

    Raises:
        KerasCompatibilityError: If Keras reduces a loss differently from
            ``sum / divisor`` for any reduction, mask and sample weight.
    """
    with tf.init_scope():  # eager, even when first called while tracing
        _check_reductions_eagerly()


def _check_reductions_eagerly() -> None:
    loss_module = _loss_module()
    reduce = getattr(loss_module, "reduce_weighted_values", None)
    if not callable(reduce):  # pragma: no cover - depends on Keras
        raise _fail("keras.src.losses.loss.reduce_weighted_values", "is missing")
    rng = np.random.default_rng(0)
    values = tf.constant(rng.uniform(0.5, 2.0, size=(3, 4)), tf.float32)
    weights = tf.constant(rng.uniform(0.5, 2.0, size=(3, 4)), tf.float32)
    mask = tf.constant(rng.uniform(size=(3, 4)) > 0.4)
    for reduction in NORMALISED_REDUCTIONS:
        for sample_weight in (None, weights):
            for m in (None, mask):
                keras_value = float(reduce(values, sample_weight, m, reduction))
                total = float(reduce(values, sample_weight, m, "sum"))
                ours = total / float(divisor(reduction, values, sample_weight, m))
                if not np.isclose(keras_value, ours, rtol=1e-5, atol=0):
                    raise _fail(
                        "keras.src.losses.loss.reduce_weighted_values",
                        f"reduces {reduction!r} to {keras_value} where kerastower "
                        f"expects sum / divisor = {ours}",
                    )
