"""Summing the towers' gradients of one variable into the one-device gradient.

Dense gradients are added. Sparse gradients (`tf.IndexedSlices`) keep the
rows one device would have made: Keras's optimizers treat each row of the
slices on its own, so a dense sum, or rows merged where one device keeps
them apart, would train another model. The same rule combines micro-batches
(`kerastower.reduce.accumulation`) and workers (`kerastower.reduce.workers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def sum_gradients(
    per_tower: Sequence[Any],
    static_rows: bool | None = None,
    first_alone: tf.Tensor | None = None,
) -> Any:
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
      is known) are gathered once by one device, and de-duplicated ids (a
      sparse input's `matmul`) have one row each: the towers' rows are
      merged by index and summed.

    The result stays sparse: a large table is never densified. `static_rows`
    overrides the row-count test (see `traced_static_rows`).

    `first_alone`, a bool scalar (or ``None`` for false), says where the
    first tower's gradient alone is the sum: where every tower ran the whole
    of a batch smaller than the tower count, the others' add nothing.
    """
    first = per_tower[0]
    if len(per_tower) == 1:
        return first
    if not isinstance(first, tf.IndexedSlices):
        total = tf.add_n(list(per_tower))
        if first_alone is None:
            return total
        # `Select` of a scalar condition hands on its input, uncopied
        # (`tf.where` copies it).
        return tf.raw_ops.Select(condition=first_alone, x=first, y=total)
    if static_rows is None:
        static_rows = has_static_rows(per_tower)
    if first_alone is not None:
        keep = tf.logical_not(first_alone)
        per_tower = [first, *(rows_if(g, keep) for g in per_tower[1:])]
    values = tf.concat([g.values for g in per_tower], axis=0)
    indices = tf.concat([g.indices for g in per_tower], axis=0)
    summed = tf.IndexedSlices(values, indices, first.dense_shape)
    return merge_rows(summed) if static_rows else summed


def rows_if(slices: tf.IndexedSlices, keep: tf.Tensor) -> tf.IndexedSlices:
    """`slices` where `keep` (a bool scalar) is true, else none of its rows."""
    rows = tf.where(keep, tf.shape(slices.indices)[0], 0)
    return tf.IndexedSlices(
        slices.values[:rows], slices.indices[:rows], slices.dense_shape
    )


def has_static_rows(per_tower: Sequence[Any]) -> bool:
    """Whether one device's sparse gradient has one row per index.

    A table gathered once per batch (a static row count, indices not
    computed from the batch: position embeddings gathered with
    ``range(length)``) is gathered once by one device, and a gather of
    de-duplicated ids (indices made by a ``Unique`` op, as in
    `tf.nn.embedding_lookup_sparse`, which Keras's `matmul` of a sparse
    input uses) has one row per id: the towers' (and workers') rows are
    merged by index. A gather of the examples' ids (indices computed from
    the batch, and a row count unknown unless the batch size is static) is
    concatenated.
    """
    return all(
        isinstance(g, tf.IndexedSlices)
        and (
            _unique_indices(g)
            or (
                g.values.shape[:1].is_fully_defined()
                and not _computed_from_data(g.indices)
            )
        )
        for g in per_tower
    )


def _unique_indices(slices: tf.IndexedSlices) -> bool:
    """Whether a traced gradient's indices come from a ``Unique`` op."""
    tensor = slices.indices
    while not tf.executing_eagerly() and hasattr(tensor, "op"):
        if tensor.op.type in ("Unique", "UniqueV2", "UniqueWithCounts"):
            return True
        if tensor.op.type not in ("Reshape", "Identity", "Cast"):
            return False
        tensor = tensor.op.inputs[0]
    return False


# Ops that read a step's data: a `tf.data` iterator's next element.
_DATA_OPS = ("Iterator", "Optional", "MultiDeviceIterator")
# Ops whose values are no data: a variable's value, a constant, and a
# shape (``range(tf.shape(x)[1])`` numbers positions, whatever the batch).
_NO_DATA_OPS = (
    "ReadVariableOp",
    "VarHandleOp",
    "Const",
    "Shape",
    "ShapeN",
    "Size",
    "Rank",
)


def _computed_from_data(tensor: Any) -> bool:
    """Whether a traced tensor is computed from the values of the traced
    function's data: an input of the function (not a variable's handle or a
    captured constant) or an iterator's element, followed through captures
    into the graphs that hold the function. Variables' values and the
    data's shapes count as no data."""
    if tf.executing_eagerly() or not hasattr(tensor, "op"):
        return False
    stack, seen = [tensor], set()
    while stack:
        tensor = stack.pop()
        op = tensor.op
        key = (id(op.graph), op.name)
        if key in seen:
            continue
        seen.add(key)
        if op.type.startswith(_DATA_OPS):
            return True
        if op.type == "Placeholder":
            outer = _captured(tensor)
            if outer is None:
                return True  # an argument of the function
            if hasattr(outer, "op"):  # not an eager tensor, a constant
                stack.append(outer)
            continue
        if op.type in _NO_DATA_OPS:
            continue
        stack.extend(t for t in op.inputs if t.dtype != tf.resource)
    return False


def _captured(placeholder: tf.Tensor) -> Any:
    """The tensor of an outer graph that a function graph's `placeholder`
    captures, or ``None`` where it is an argument of the function."""
    for outer, inner in getattr(placeholder.graph, "captures", ()):
        if inner is placeholder:
            return outer
    return None


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


class EagerStaticRows:
    """`traced_static_rows` of an eager step, traced once per kind of step.

    Call it with ``(loss_fn, variables, data)``: ``None`` in a traced step
    (where `has_static_rows` reads the graph), else the set of indices,
    cached by the loss function, the variables and the data's dtypes.
    """

    def __init__(self):
        self._found: dict = {}

    def __call__(self, loss_fn, variables: Sequence[Any], data: Any) -> set[int] | None:
        if not tf.executing_eagerly():
            return None
        key = (
            getattr(loss_fn, "__code__", loss_fn),
            tuple(id(v) for v in variables),
            repr(tf.nest.map_structure(lambda t: getattr(t, "dtype", t), data)),
        )
        if key not in self._found:
            self._found[key] = traced_static_rows(loss_fn, variables, data)
        return self._found[key]


def merge_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """Sums the rows of `slices` that share an index (one row per index)."""
    unique, position = tf.unique(slices.indices)
    # `tf.shape`, not `tf.size`: for rows read from a variable of unknown
    # length (a window of `kerastower.reduce.accumulation`), `tf.size` of the
    # unique indices came out 0 in a traced step while `tf.shape` was right.
    values = tf.math.unsorted_segment_sum(slices.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, slices.dense_shape)
