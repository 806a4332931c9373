"""How far apart two runs are: plain functions on arrays."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf


def relative_difference(
    actual: Any, expected: Any, scale: float | None = None
) -> float:
    """``max |actual - expected| / scale`` over one array.

    Args:
        actual: The array measured, any array-like.
        expected: The array it should equal, of the same shape.
        scale: What the difference is relative to. Defaults to ``None``:
            ``max |expected|``.

    Returns:
        The relative difference: 0 for two empty arrays or equal ones of
        scale 0, ``inf`` for arrays of different shapes or a difference at
        scale 0, NaN where one array holds a NaN that the other does not.
    """
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    both_nan = np.isnan(a) & np.isnan(b)
    difference = float(np.max(np.where(both_nan, 0.0, np.abs(a - b))))
    if scale is None:
        scale = float(np.max(np.where(both_nan, 0.0, np.abs(b))))
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale


def reorder_batches(data: Any, batch_size: int, seed: int = 1) -> Any:
    """`data` with the examples of each batch in another order.

    Batch ``k`` holds examples ``k * batch_size`` up to the next batch, the
    last one maybe fewer, as `fit` cuts them with ``shuffle=False``; the same
    permutation applies to every array of the nest `data`, so inputs,
    targets and sample weights stay together. A model that treats the
    examples of a batch alike computes the same update from either order,
    up to the rounding of its sums.

    Args:
        data: An array, or a nest (tuple, list, dict) of arrays with the
            examples on axis 0; ``None`` leaves stay ``None``.
        batch_size: The batch size `fit` cuts `data` into.
        seed: Seed of the permutations. Defaults to 1.

    Returns:
        The same nest of reordered arrays.
    """
    leaves = [leaf for leaf in tf.nest.flatten(data) if leaf is not None]
    if not leaves:
        return data
    n = len(leaves[0])
    rng = np.random.default_rng(seed)
    order = np.concatenate(
        [
            start + rng.permutation(min(batch_size, n - start))
            for start in range(0, n, batch_size)
        ]
    )
    return tf.nest.map_structure(
        lambda leaf: None if leaf is None else np.asarray(leaf)[order], data
    )
