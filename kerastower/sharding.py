"""Cutting nests of tensors into tower shards and gathering them back.

The graph-side companions of `kerastower.splitting`: a global batch (any nest
of tensors with the batch on axis 0) is cut into contiguous shards in tower
order, and per-tower outputs are concatenated back in that order, so
predictions keep the input order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def first_leaf(structure: Any) -> tf.Tensor:
    """Returns the first tensor of a nest that is not ``None``."""
    return next(t for t in tf.nest.flatten(structure) if t is not None)


def split_nest(structure: Any, sizes: tf.Tensor, towers: int) -> list[Any]:
    """Cuts every batched leaf of `structure` into `towers` contiguous shards."""
    flat = tf.nest.flatten(structure)
    pieces = [
        [None] * towers if t is None else tf.split(t, sizes, num=towers, axis=0)
        for t in flat
    ]
    return [
        tf.nest.pack_sequence_as(structure, [p[i] for p in pieces])
        for i in range(towers)
    ]


def concat_nest(per_tower: Sequence[Any]) -> Any:
    """Concatenates per-tower nests along the batch axis, in tower order."""
    return tf.nest.map_structure(lambda *shards: tf.concat(shards, axis=0), *per_tower)


def sum_gradients(per_tower: Sequence[Any]) -> Any:
    """Sums one variable's per-tower gradients (dense or `IndexedSlices`)."""
    if isinstance(per_tower[0], tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([g.values for g in per_tower], axis=0),
            tf.concat([g.indices for g in per_tower], axis=0),
            per_tower[0].dense_shape,
        )
    return tf.add_n(list(per_tower))


class LossMetricRecorder:
    """Stands in for a per-output loss metric while towers trace.

    Keras updates one `Mean` per output inside `compute_loss`; inside towers
    that would add one entry per tower. The recorder keeps each tower's value
    so that `TowerModel` can update the real metric once with the global value.
    """

    def __init__(self):
        self.values: dict[int, list[tf.Tensor]] = {}

    def update_state(self, value, sample_weight=None):
        self.values.setdefault(threading.get_ident(), []).append(value)

    def pop(self) -> list[tf.Tensor]:
        return self.values.pop(threading.get_ident(), [])


def local_results(strategy: tf.distribute.Strategy, outputs: Any) -> list[Any]:
    """Turns a nest of per-replica values into one nest per tower."""
    flat = [strategy.experimental_local_results(v) for v in tf.nest.flatten(outputs)]
    towers = len(flat[0]) if flat else 0
    return [
        tf.nest.pack_sequence_as(outputs, [leaf[i] for leaf in flat])
        for i in range(towers)
    ]
