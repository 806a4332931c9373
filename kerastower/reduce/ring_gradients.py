"""Gradients and weights through a `Ring`: what keeps replicas equal.

- `all_reduce`: every tower's gradients summed, the sum on every tower. Dense
  gradients of one dtype are packed into buckets, each one ring all-reduce
  (`Ring.sum_tensors`); sparse ones (`tf.IndexedSlices`) are all-gathered as
  rows, values and indices, in tower order (as `MirroredStrategy` gathers
  them), and each tower combines the rows as one device has them
  (`kerastower.reduce.gradients`: kept, or merged by index).
- `broadcast`: tower 0's weights on every tower, as one ring all-reduce of
  ``W`` bytes to which tower 0 adds the weights and every other tower
  ``-0.0``, the identity of floating-point addition (``w + -0.0 == w`` for
  every ``w``, ``-0.0`` included): each device moves ``2 (N-1)/N * W``
  bytes, where sending a copy to each tower would move ``(N-1) * W``
  through the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.reduce.gradients import has_static_rows, merge_rows, rows_if
from kerastower.reduce.ring import (
    AllReduceOptions,
    Ring,
    dtype_buckets,
    pack,
    unpack,
    wire_dtype,
)


def nothing_like(gradient: Any) -> Any:
    """A gradient that adds nothing: zeros, or slices of no rows."""
    if isinstance(gradient, tf.IndexedSlices):
        values = gradient.values
        return tf.IndexedSlices(
            tf.zeros([0, *values.shape[1:]], values.dtype),
            tf.zeros([0], gradient.indices.dtype),
            gradient.dense_shape,
        )
    return _zeros_when_run(gradient)


def _zeros_when_run(like: tf.Tensor) -> tf.Tensor:
    """Zeros of `like`'s shape and dtype, filled when the op runs.

    Grappler folds ``tf.zeros_like`` of a static shape into a constant,
    which every instantiation of the function holds for its life, filled
    when it first runs, whether or not its branch ever does: ResNet50's
    gradient buckets held 94 MB of zeros per tower. Filled to a shape that
    Grappler cannot see, they are not folded.
    """
    zeros = tf.fill(_keras_compat.unseen(tf.shape(like)), tf.zeros([], like.dtype))
    zeros.set_shape(like.shape)
    return zeros


def sum_in_call(
    gradients: Sequence[Any],
    shapes: Sequence[tf.TensorShape],
    sum_flat: Callable[[tf.Tensor], tf.Tensor],
    options: AllReduceOptions,
    runs: tf.Tensor | None = None,
) -> list[Any]:
    """One tower's dense gradients summed over the towers, from inside the
    tower's function (`kerastower.step.traced_towers`), called on every tower.

    As `all_reduce` sums them: packed per dtype into the same buckets, each
    summed by one collective (`sum_flat`, over the calls), so every tower
    gets the same bits. Sparse gradients are returned, for the step to
    gather.

    Args:
        gradients: The tower's gradients.
        shapes: Their variables' static shapes.
        sum_flat: Sums a vector over the calls, one collective per call
            (`kerastower.reduce.towers.TowerCollectives.sum_flat`).
        options: The buckets' size and compression.
        runs: A bool scalar, or ``None`` for true: where false, the tower
            adds nothing (zeros, and sparse gradients of no rows) in place
            of its gradients.
    """
    out = list(gradients)
    dense = []
    for k, gradient in enumerate(gradients):
        if not isinstance(gradient, tf.IndexedSlices):
            dense.append(k)
        elif runs is not None:
            out[k] = rows_if(gradient, runs)
    for dtype in sorted({gradients[k].dtype for k in dense}, key=str):
        where = [k for k in dense if gradients[k].dtype == dtype]
        wire = wire_dtype(options, dtype)
        for bucket in dtype_buckets(options, [shapes[k] for k in where], dtype):
            chosen = [where[b] for b in bucket]
            flat = tf.cast(pack([gradients[k] for k in chosen]), wire)
            if runs is not None:  # a branch passes the bucket on, uncopied
                flat = tf.cond(
                    runs, lambda flat=flat: flat, lambda flat=flat: nothing_like(flat)
                )
            total = tf.cast(sum_flat(flat), dtype)
            for k, piece in zip(chosen, unpack(total, [shapes[k] for k in chosen])):
                out[k] = piece
    return out


def all_reduce(
    ring: Ring,
    per_tower: Sequence[Sequence[Any]],
    static_rows: Sequence[bool | None] | None,
    options: AllReduceOptions,
    summed: bool = False,
) -> list[list[Any]]:
    """Sums the towers' gradients; every tower gets the sum on its device.

    Args:
        ring: The collectives over the towers (``ring.devices``).
        per_tower: Each tower's gradients, dense ones of their variables'
            static shapes, tower 0's first.
        static_rows: Per gradient, `kerastower.reduce.gradients.sum_gradients`'s
            ``static_rows`` for sparse ones (``None``: from the shapes).
        options: The dense buckets' size and compression.
        summed: Whether the dense gradients are sums already (`sum_in_call`):
            only the sparse ones are then gathered.

    Returns:
        Each tower's sums, in the order of its gradients.
    """
    devices = ring.devices
    count = len(per_tower[0])
    static_rows = static_rows or [None] * count
    out: list[list[Any]] = [[None] * count for _ in per_tower]
    sparse = [
        k
        for k in range(count)
        if all(isinstance(t[k], tf.IndexedSlices) for t in per_tower)
    ]
    for k in sparse:
        first = per_tower[0][k]
        rows = []
        for device, grads in zip(devices, per_tower):
            with tf.device(device):
                # int64: int32 would live in a GPU's host memory.
                ids = tf.cast(grads[k].indices, tf.int64)
                rows.append([grads[k].values, ids])
        gathered = ring.gather_rows(rows)
        merge = static_rows[k]
        if merge is None:
            merge = has_static_rows([t[k] for t in per_tower])
        for tower, grads in enumerate(out):
            with tf.device(devices[tower]):
                values, ids = gathered[tower]
                rows = tf.IndexedSlices(
                    values, tf.cast(ids, first.indices.dtype), first.dense_shape
                )
                grads[k] = merge_rows(rows) if merge else rows
    dense = [k for k in range(count) if k not in sparse]
    if summed:
        for tower, grads in enumerate(out):
            for k in dense:
                grads[k] = per_tower[tower][k]
        return out
    for dtype in sorted({per_tower[0][k].dtype for k in dense}, key=str):
        where = [k for k in dense if per_tower[0][k].dtype == dtype]
        tensors = []
        for device, grads in zip(devices, per_tower):
            with tf.device(device):
                tensors.append([tf.convert_to_tensor(grads[k]) for k in where])
        for tower, sums in enumerate(ring.sum_tensors(tensors, options)):
            for k, value in zip(where, sums):
                out[tower][k] = value
    return out


def broadcast(
    ring: Ring, variables: Sequence[Any], options: AllReduceOptions
) -> list[list[tf.Tensor]]:
    """The values of `variables` (on tower 0) on every tower, exactly.

    One uncompressed `all_reduce`, in buckets of ``options.bucket_mb``, of
    the values on tower 0 and ``-0.0`` on the others; see the module
    docstring.

    Returns:
        Each tower's values, in the order of `variables`.
    """
    per_tower = [[v.value for v in variables]]
    for device in ring.devices[1:]:
        with tf.device(device):
            per_tower.append(
                [tf.fill(v.shape, tf.constant(-0.0, v.dtype)) for v in variables]
            )
    exact = AllReduceOptions(bucket_mb=options.bucket_mb)
    return all_reduce(ring, per_tower, None, exact)
