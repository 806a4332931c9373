"""How far two runs are apart on JAX, and the yardstick run that says how far
rounding alone moves them: plain functions for the demo, the benchmarks and
the tests.

The yardstick is one device trained on the same batches with each batch's
rows in reverse order: the same examples and the same math, summed in another
order, so what it changes is this machine's float rounding.
"""

from __future__ import annotations

import jax
import numpy as np


def reversed_batches(arrays, batch_size: int):
    """`arrays` (a nest of arrays with the same rows) with the rows of each
    batch of `batch_size` reversed, the last, shorter batch included."""
    rows = len(jax.tree.leaves(arrays)[0])
    order = np.concatenate(
        [
            np.arange(start, min(start + batch_size, rows))[::-1]
            for start in range(0, rows, batch_size)
        ]
    )
    return jax.tree.map(lambda a: a[order], arrays)


def weights_apart(model, other, floor: float = 0.0) -> float:
    """The largest weight difference of two models of one architecture,
    divided by `model`'s largest weight (at least `floor`)."""
    weights, others = model.get_weights(), other.get_weights()
    if len(weights) != len(others):
        raise ValueError(
            "`model` and `other` must have the same weights. Received: "
            f"{len(weights)} and {len(others)} weights"
        )
    scale = max(floor, *(float(np.max(np.abs(w))) for w in weights if w.size))
    apart = (float(np.max(np.abs(a - b))) for a, b in zip(weights, others) if a.size)
    return max(apart, default=0.0) / scale
