"""Cutting a global batch into tower shards, and gathering the towers' outputs.

A global batch of ``B`` examples is cut into ``N`` contiguous shards, one per
tower. The first ``B mod N`` towers get ``floor(B / N) + 1`` examples, the
others ``floor(B / N)``; when ``B < N`` the last towers get none. Shard ``i``
holds examples ``[start_i, start_i + size_i)`` so concatenating the shards in
tower order restores the input order.

Each tower's loss is weighted by its share of the global batch,
``w_i = size_i / B``, so that for a loss that is a mean over examples::

    sum_i w_i * mean(loss over shard i) = mean(loss over the global batch)

which is the loss one device computes on the whole batch.

The math is in plain functions (`split_sizes`, `split_offsets`,
`loss_weights`); `split_nest` and `concat_nest` apply it to nests of tensors
in a traced step, keeping Keras masks with the shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from kerastower import _keras_compat


def _check_counts(batch_size: int, towers: int) -> None:
    if not isinstance(towers, int) or isinstance(towers, bool) or towers < 1:
        raise ValueError(
            f"`towers` must be an integer >= 1. Received: towers={towers!r}"
        )
    if (
        not isinstance(batch_size, int)
        or isinstance(batch_size, bool)
        or batch_size < 0
    ):
        raise ValueError(
            f"`batch_size` must be an integer >= 0. Received: batch_size={batch_size!r}"
        )


def split_sizes(batch_size: int, towers: int) -> list[int]:
    """Returns how many examples of a global batch each tower gets.

    `TowerModel` cuts a **global** batch of ``B`` examples into ``N``
    contiguous shards in input order: the first ``B mod N`` towers get
    ``B // N + 1`` examples, the others ``B // N``.

    Example:

    ```python
    >>> import kerastower
    >>> kerastower.split_sizes(10, 3)
    [4, 3, 3]
    >>> kerastower.split_sizes(1, 4)
    [1, 0, 0, 0]
    ```

    Args:
        batch_size: The global batch size ``B`` (all towers together), an
            integer of at least 0.
        towers: The number of towers ``N``, an integer of at least 1.

    Returns:
        A list of ``N`` integers summing to ``B``; entry ``i`` is
        ``B // N + (1 if i < B % N else 0)``.

    Raises:
        ValueError: If ``batch_size`` is negative or ``towers`` is less than 1.
    """
    _check_counts(batch_size, towers)
    base, rest = divmod(batch_size, towers)
    return [base + (1 if i < rest else 0) for i in range(towers)]


def split_offsets(batch_size: int, towers: int) -> list[int]:
    """Returns the first index of each tower's shard in the global batch.

    Args:
        batch_size: The global batch size, an integer >= 0.
        towers: The number of towers, an integer >= 1.

    Returns:
        A list of ``N`` start offsets; shard ``i`` is
        ``[offsets[i], offsets[i] + sizes[i])``.
    """
    offsets, start = [], 0
    for size in split_sizes(batch_size, towers):
        offsets.append(start)
        start += size
    return offsets


def loss_weights(batch_size: int, towers: int) -> list[float]:
    """Returns each tower's loss weight ``size_i / B``.

    Args:
        batch_size: The global batch size ``B``, an integer >= 1.
        towers: The number of towers, an integer >= 1.

    Returns:
        A list of ``N`` floats summing to 1; a tower with no example gets 0.
    """
    if batch_size == 0:
        raise ValueError("`batch_size` must be >= 1. Received: batch_size=0")
    return [size / batch_size for size in split_sizes(batch_size, towers)]


def tensor_split_sizes(batch_size: tf.Tensor, towers: int) -> tf.Tensor:
    """Graph version of `split_sizes` for a dynamic (tensor) batch size.

    Args:
        batch_size: A scalar int32 tensor, the global batch size.
        towers: The number of towers, a Python integer >= 1.

    Returns:
        An int32 tensor of shape ``(towers,)`` equal to
        ``split_sizes(batch_size, towers)``.
    """
    batch_size = tf.cast(batch_size, tf.int32)
    base = batch_size // towers
    rest = batch_size - base * towers
    extra = tf.cast(tf.range(towers) < rest, tf.int32)
    return base + extra


def even_shard(data: Any, towers: int) -> int | None:
    """The examples of every tower's shard where the global batch `data`
    has a static size ``B`` that `towers` divides, ``B >= N``; else ``None``.

    Such shards keep their static batch size ``B / N``: a tower traced on
    them folds the shapes that it would otherwise compute at run time.
    """
    batch = tf.compat.dimension_value(first_leaf(data).shape[0])
    if batch is None or batch < towers or batch % towers:
        return None
    return batch // towers


class Shards(NamedTuple):
    """The global batch cut for the towers (`tower_shards`).

    Attributes:
        sizes: ``n_i``, int32 of shape ``(N,)``.
        weights: ``n_i / B`` in float64, the correctly rounded share in any
            dtype once cast.
        shards: The ``N`` contiguous shards, nests like the batch.
        even: Whether the batch splits evenly (`even_shard`): the sizes are
            constants and the shards keep their static batch size. Otherwise
            the sizes are hidden from shape inference, so that a tower's
            batch size is unknown whatever the global batch, as it is for
            the tower traced once for every size.
    """

    sizes: tf.Tensor
    weights: tf.Tensor
    shards: list[Any]
    even: bool


def tower_shards(data: Any, batch: tf.Tensor, total: tf.Tensor, towers: int) -> Shards:
    """Cuts the global batch `data` into the towers' shards (`Shards`).

    Args:
        data: The batch, a nest of tensors of ``batch`` rows.
        batch: Its rows, an int32 scalar tensor.
        total: The examples the weights divide by, ``B`` (this worker's
            batch, or every worker's).
        towers: ``N``.
    """
    even = even_shard(data, towers)
    if even is not None:
        sizes = tf.constant([even] * towers, tf.int32)
    else:
        # Sizes that tracing cannot infer: a statically empty shard makes
        # Keras return an unreduced loss of shape (0,).
        sizes = _keras_compat.unseen(tensor_split_sizes(batch, towers))
    weights = tf.cast(sizes, tf.float64) / tf.cast(total, tf.float64)
    return Shards(sizes, weights, split_nest(data, sizes, towers), even is not None)


def first_leaf(structure: Any) -> tf.Tensor:
    """Returns the first tensor of a nest that is not ``None``."""
    return next(t for t in tf.nest.flatten(structure) if t is not None)


def split_nest(structure: Any, sizes: tf.Tensor, towers: int) -> list[Any]:
    """Cuts every batched leaf of `structure` into `towers` contiguous shards.

    Leaves are dense, ragged or sparse tensors (a `tf.SparseTensor` is cut
    into blocks of rows, its dense shape's other dimensions kept).
    """
    flat = tf.nest.flatten(structure)
    pieces = [[None] * towers if t is None else _split(t, sizes, towers) for t in flat]
    return [
        tf.nest.pack_sequence_as(structure, [p[i] for p in pieces])
        for i in range(towers)
    ]


def _split(t: Any, sizes: tf.Tensor, towers: int) -> list[Any]:
    if not isinstance(t, tf.SparseTensor):
        return tf.split(t, sizes, num=towers, axis=0)
    sizes = tf.cast(sizes, tf.int64)
    starts = tf.cumsum(sizes, exclusive=True)
    rest = t.dense_shape[1:]
    shards = []
    for i in range(towers):
        shard = tf.sparse.slice(
            t,
            tf.concat([starts[i : i + 1], tf.zeros_like(rest)], 0),
            tf.concat([sizes[i : i + 1], rest], 0),
        )
        shard.set_shape(tf.TensorShape([None]).concatenate(t.shape[1:]))
        shards.append(shard)
    return shards


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


def gather_nest(structure: Any, gather: Any) -> Any:
    """Every tower's rows of a nest's leaves and Keras masks, concatenated.

    Args:
        structure: This tower's nest (``None`` leaves are kept).
        gather: Concatenates a list of tensors over the towers, in tower
            order (`kerastower.reduce.towers.gather_over_towers`).

    Returns:
        The nest of the global batch, with the concatenated masks.
    """
    flat = tf.nest.flatten(structure)
    present = [i for i, t in enumerate(flat) if t is not None]
    masks = masks_of(structure)
    gathered = gather([flat[i] for i in present] + list(masks.values()))
    whole = list(flat)
    for i, t in zip(present, gathered):
        whole[i] = t
    rest = gathered[len(present) :]
    return with_masks(
        tf.nest.pack_sequence_as(structure, whole), dict(zip(masks, rest))
    )


def local_results(strategy: tf.distribute.Strategy, outputs: Any) -> list[Any]:
    """Turns a nest of per-replica values into one nest per tower."""
    flat = [strategy.experimental_local_results(v) for v in tf.nest.flatten(outputs)]
    towers = len(flat[0]) if flat else 0
    return [
        tf.nest.pack_sequence_as(outputs, [leaf[i] for leaf in flat])
        for i in range(towers)
    ]
