"""Cutting nests of tensors into tower shards and gathering them back.

The graph-side companions of `kerastower.splitting`: a global batch (any nest
of tensors with the batch on axis 0) is cut into contiguous shards in tower
order, and per-tower outputs are concatenated back in that order, so
predictions keep the input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat


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


def masks_of(structure: Any) -> dict[int, tf.Tensor]:
    """The Keras masks of a nest's leaves, by leaf position.

    Masks live on tensor attributes, which do not cross `Strategy.run`; a
    tower returns them with this and `with_masks` puts them back.
    """
    flat = tf.nest.flatten(structure)
    masks = {i: _keras_compat.get_keras_mask(t) for i, t in enumerate(flat)}
    return {i: m for i, m in masks.items() if m is not None}


def with_masks(structure: Any, masks: dict[int, tf.Tensor]) -> Any:
    """Attaches masks from `masks_of` to (copies of) the nest's leaves."""
    flat = [
        tf.identity(t) if i in masks else t
        for i, t in enumerate(tf.nest.flatten(structure))
    ]
    for i, mask in masks.items():
        _keras_compat.set_keras_mask(flat[i], mask)
    return tf.nest.pack_sequence_as(structure, flat)


def concat_nest(per_tower: Sequence[Any]) -> Any:
    """Concatenates per-tower nests along the batch axis, in tower order.

    Keras masks carried by the shards (``Embedding(mask_zero=True)``, ...) are
    concatenated too, so that metrics see the mask one device would.
    """

    def concat(*shards):
        whole = tf.concat(shards, axis=0)
        masks = [_keras_compat.get_keras_mask(shard) for shard in shards]
        if all(mask is not None for mask in masks):
            _keras_compat.set_keras_mask(whole, tf.concat(masks, axis=0))
        return whole

    return tf.nest.map_structure(concat, *per_tower)


def sum_gradients(per_tower: Sequence[Any], static_rows: bool | None = None) -> Any:
    """Sums one variable's per-tower gradients into the one-device gradient.

    Dense gradients are added. Sparse ones (`tf.IndexedSlices`, from gathers
    such as `Embedding`) are combined as one device would have made them, since
    optimizers that are not linear in the gradient (Adam, RMSprop, Adagrad, ...)
    treat each row of the slices on its own:

    - rows whose count depends on the batch (a gather of the examples' token
      ids, the usual case: the static row count is unknown) are concatenated
      in tower order, which are one device's rows;
    - rows whose count does not (a table gathered once per batch, such as
      position embeddings gathered with ``range(length)``: the static row count
      is known) are gathered once by one device, so the towers' rows are
      merged by index and summed.

    The result stays sparse: a large table is never densified. `static_rows`
    overrides the row-count test (see `traced_static_rows`).
    """
    first = per_tower[0]
    if len(per_tower) == 1:
        return first
    if not isinstance(first, tf.IndexedSlices):
        return tf.add_n(list(per_tower))
    values = tf.concat([g.values for g in per_tower], axis=0)
    indices = tf.concat([g.indices for g in per_tower], axis=0)
    summed = tf.IndexedSlices(values, indices, first.dense_shape)
    if has_static_rows(per_tower) if static_rows is None else static_rows:
        return merge_rows(summed)
    return summed


def has_static_rows(per_tower: Sequence[Any]) -> bool:
    """Whether sparse per-tower gradients gather a fixed set of rows.

    A table gathered once per batch (static row count) is gathered once by
    one device, so the towers' (and workers') rows are merged by index; a
    gather of the examples' ids (row count unknown) is concatenated.
    """
    return all(
        isinstance(g, tf.IndexedSlices) and g.values.shape[:1].is_fully_defined()
        for g in per_tower
    )


def traced_static_rows(loss_fn, variables: Sequence[Any], data: Any) -> set[int]:
    """Which `variables` get sparse gradients of a fixed set of rows, by tracing.

    Eager tensors all have static shapes, so `has_static_rows` cannot tell a
    table gathered once per batch from a gather of the examples' ids there.
    This traces ``loss_fn(data)`` once, with the batch size unknown, and reads
    the answer off the graph, as a traced step would.

    Args:
        loss_fn: Returns ``(loss, outputs)`` for a batch.
        variables: The variables to differentiate.
        data: A batch (a nest of tensors, batch first; ``None`` leaves kept).

    Returns:
        The indices in `variables` of the fixed-row gradients. Empty when
        ``loss_fn`` cannot be traced: rows are then concatenated, which is
        right for gathers of the examples' ids, the usual case.
    """
    found: set[int] = set()

    def spec(t):
        t = tf.convert_to_tensor(t)
        return tf.TensorSpec([None, *t.shape[1:]], t.dtype)

    def probe(batch):
        with tf.GradientTape() as tape:
            loss, _ = loss_fn(batch)
        grads = tape.gradient(loss, list(variables))
        found.update(
            j
            for j, g in enumerate(grads)
            if isinstance(g, tf.IndexedSlices) and has_static_rows([g])
        )
        return loss

    specs = tf.nest.map_structure(lambda t: None if t is None else spec(t), data)
    try:
        tf.function(probe, autograph=False).get_concrete_function(specs)
    except Exception:  # code that only runs eagerly: keep concatenating
        return set()
    return found


def merge_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """Sums the rows of `slices` that share an index (one row per index)."""
    unique, position = tf.unique(slices.indices)
    # `tf.shape`, not `tf.size`: for rows read from a variable of unknown
    # length (a window of `kerastower.accumulation`), `tf.size` of the
    # unique indices came out 0 in a traced step while `tf.shape` was right.
    values = tf.math.unsorted_segment_sum(slices.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, slices.dense_shape)


def local_results(strategy: tf.distribute.Strategy, outputs: Any) -> list[Any]:
    """Turns a nest of per-replica values into one nest per tower."""
    flat = [strategy.experimental_local_results(v) for v in tf.nest.flatten(outputs)]
    towers = len(flat[0]) if flat else 0
    return [
        tf.nest.pack_sequence_as(outputs, [leaf[i] for leaf in flat])
        for i in range(towers)
    ]
