"""Sums over every tower of every worker, from inside a tower's step.

Two statistics of a step need the whole global batch while the towers are
still running their forward pass: the divisors of the compiled losses
(`kerastower.step.loss_weighting`) and the moments of synchronised
`BatchNormalization` (`kerastower.step.batch_norm`). One device would compute them
over every example of every worker, so `TowerSum` sums them in three moves:

1. the towers of this worker sum their values (the replica context's
   all-reduce; the identity on one tower);
2. the first tower of every worker adds the workers' sums with one
   collective all-reduce (``CollectiveReduceV2``, TensorFlow's collective
   engine that `MultiWorkerMirroredStrategy` runs on) per dtype, in a group of
   its own: one member per worker, whatever each worker's tower count;
3. the first tower hands the result to this worker's other towers by a second
   within-worker sum in which they add zeros (exact: ``x + 0 == x``).

A sum is its own adjoint, so its gradient (masked `BatchNormalization`
differentiates through the mean) is the same three moves on the upstream
gradients.

On one worker only the first move runs. Every worker must issue the same
collectives in the same order, with the same instance keys: each step
reserves a block of keys (`kerastower.reduce.keys`), and a `TowerSum` numbers
its collectives from the start of that block, so the step's branch that runs
on all towers and the one that runs on one tower (a batch smaller than the
tower count, `TowerRuns.split_run`) issue the same keys; workers that take
different branches still meet.

Inside a tower traced once and called on every device
(`kerastower.step.traced_towers`) the within-worker sum is
`TowerCollectives`: one collective per dtype over the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from kerastower.reduce import keys


def sum_over_towers(values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Sums tensors over the towers of this step (identity outside towers).

    Differentiable: the gradient of each tower's value is the sum of the
    upstream gradients over the towers (see `self_adjoint`).
    """
    return self_adjoint(values, all_reduce)


def self_adjoint(
    values: Sequence[tf.Tensor],
    total: Callable[[list[tf.Tensor]], list[tf.Tensor]],
) -> list[tf.Tensor]:
    """``total(values)``, a sum over towers, with a sum's gradient.

    A sum over every tower is its own adjoint: the gradient of each tower's
    value is `total` of the towers' upstream gradients. `total` runs on
    values that carry no gradient; the result is attached to `values` by a
    `tf.custom_gradient` whose outputs are copies of `total`'s. In a traced
    step `tf.custom_gradient` searches every op between its outputs and its
    inputs for variables: here that search ends at once, where a sum taken
    inside it would walk every other tower's graph up to its inputs, once per
    sum (per `BatchNormalization` layer), and tracing would grow with the
    square of the model's depth.

    Args:
        values: This tower's tensors.
        total: Sums a list of tensors over the towers; called on tensors
            without gradient, in the forward and in the backward pass.

    Returns:
        ``total(values)``, differentiable with respect to `values` (to any
        order).
    """
    values = list(values)
    count = len(values)
    sums = total([tf.stop_gradient(v) for v in values])

    @tf.custom_gradient
    def attach(*flat):
        def grad(*upstream):
            upstream = [
                tf.zeros_like(v) if g is None else g for g, v in zip(upstream, values)
            ]
            return self_adjoint(upstream, total) + [None] * count

        return list(flat[count:]), grad  # copied by `tf.custom_gradient`

    return list(attach(*values, *sums))


def gather_over_towers(
    values: Sequence[tf.Tensor],
    sizes: tf.Tensor,
    sum_fn: Callable[[list[tf.Tensor]], list[tf.Tensor]] = sum_over_towers,
    offset: tf.Tensor | int = 0,
    total: tf.Tensor | None = None,
) -> list[tf.Tensor]:
    """Every tower's `values`, concatenated along axis 0 in tower order.

    Called by every tower with its rows: tower ``i`` places its ``n_i`` rows
    at rows ``[o_i, o_i + n_i)`` of ``B`` rows of zeros
    (``o_i = offset + sum_{j<i} n_j``) and the towers sum them; on several
    workers, `sum_fn` sums over every tower of every worker, `offset` is
    the examples of the workers before this one and ``B`` all workers'.
    The result is exact (``x + 0 == x``) and every tower gets the same one.
    Differentiable: the gradient of tower ``i``'s rows is rows
    ``[o_i, o_i + n_i)`` of the sum of the towers' upstream gradients. An
    all-reduce of ``B`` rows moves ``N`` times the bytes of an all-gather;
    it is used for predictions and targets, which are small.

    Args:
        values: This tower's tensors, each with its ``n_i`` rows first;
            booleans and int32 are summed as int64.
        sizes: ``(n_0, ..., n_{N-1})``, every tower's row count.
        sum_fn: Sums a list of tensors over the towers.
        offset: Where this worker's rows start.
        total: ``B``; defaults to ``sum(sizes)`` (one worker).

    Returns:
        The gathered tensors, ``B`` rows each, in `values`' dtypes.
    """
    context = tf.distribute.get_replica_context()
    sizes = tf.cast(sizes, tf.int32)
    start = offset + tf.reduce_sum(sizes[: context.replica_id_in_sync_group])
    total = tf.reduce_sum(sizes) if total is None else tf.cast(total, tf.int32)
    values = [tf.convert_to_tensor(value) for value in values]
    padded = []
    for value in values:
        # int32 lives in host memory, which one all-reduce cannot mix with
        # the devices' tensors: booleans and int32 travel as int64.
        narrow = value.dtype in (tf.bool, tf.int32)
        summable = tf.cast(value, tf.int64) if narrow else value
        rows = [[start, total - start - tf.shape(value)[0]]]
        padded.append(tf.pad(summable, rows + [[0, 0]] * (value.shape.rank - 1)))
    gathered = []
    for value, whole in zip(values, sum_fn(padded)):
        if value.dtype in (tf.bool, tf.int32):
            whole = tf.cast(whole, value.dtype)
        whole.set_shape(tf.TensorShape([None]).concatenate(value.shape[1:]))
        gathered.append(whole)
    return gathered


def all_reduce(values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Sums tensors without gradient over the towers of this step."""
    context = tf.distribute.get_replica_context()
    return list(context.all_reduce(tf.distribute.ReduceOp.SUM, list(values)))


class TowerSum:
    """Sums a list of tensors over every tower of every worker.

    Call it from inside a tower (a replica context of the tower strategy) or
    on the one tower that runs a small batch whole (the default replica
    context). Every tower of the step must call it, with values of the same
    shapes and dtypes, in the same order.

    Args:
        workers: How many workers train together (1: sum over towers only).
        device: This worker's first tower, where the cross-worker collective
            runs.
        timeout_seconds: How long a collective may wait for the other
            workers.
        block: The step's `kerastower.reduce.keys.StepBlock` of instance
            keys; ``None`` on one worker, where no collective runs.
    """

    def __init__(
        self,
        workers: int,
        device: str,
        timeout_seconds: float,
        block: keys.StepBlock | None,
    ):
        self.workers = workers
        self.device = device
        self.timeout_seconds = timeout_seconds
        self.block = block
        self.next_key = 0  # the next key's place in the block

    def __call__(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        return self_adjoint(list(values), self.total)

    def total(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The sums, without gradient (`__call__` differentiates them)."""
        values = list(values)
        if self.workers == 1:
            return all_reduce(values)
        local = all_reduce(values)
        context = tf.distribute.get_replica_context()
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        if replica == 0:
            mine = self._over_workers(local)
        else:
            mine = [tf.zeros_like(v) for v in local]
        return all_reduce(mine)

    def _over_workers(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """One collective per dtype, over the first towers of all workers."""

        def collective(flat):
            key = self.block.key(self.next_key)
            self.next_key += 1
            return over_workers(
                flat,
                self.workers,
                self.device,
                key,
                self.timeout_seconds,
                self.block.group,
            )

        return sum_by_dtype(values, collective)


def over_workers(
    value: tf.Tensor,
    workers: int,
    device: str,
    instance_key: int | tf.Tensor,
    timeout_seconds: float,
    group_key: int | tf.Tensor = keys.WORKERS_GROUP_KEY,
    gather: bool = False,
) -> tf.Tensor:
    """One collective over the first towers of `workers` workers.

    The sum of `value` over the workers (``CollectiveReduceV2``), or with
    `gather` every worker's `value` concatenated along the first axis, in
    worker order (``CollectiveGatherV2``). Every worker calls it with a
    `value` of the same shape and dtype and the same keys.

    Args:
        value: This worker's tensor.
        workers: The number of workers.
        device: This worker's first tower, where the collective runs.
        instance_key: The collective's instance key (`kerastower.reduce.keys`).
        timeout_seconds: How long it may wait for the other workers; 0 for
            no limit.
        group_key: The group: `keys.WORKERS_GROUP_KEY`, or one whose sums
            keep one shape, of a global batch size (`keys.batch_group_key`)
            or of gathered rows (`keys.rows_group`).
        gather: Whether to gather rather than sum.

    Returns:
        The sum (the shape of `value`) or the gathered tensor.
    """
    common = dict(
        input=value,
        group_size=workers,
        group_key=group_key,
        instance_key=instance_key,
        ordering_token=[],
        communication_hint="auto",
        timeout_seconds=timeout_seconds,
    )
    with tf.device(device):
        if gather:
            return tf.raw_ops.CollectiveGatherV2(**common)
        return tf.raw_ops.CollectiveReduceV2(merge_op="Add", final_op="Id", **common)


def sum_by_dtype(
    values: Sequence[tf.Tensor], sum_flat: Callable[[tf.Tensor], tf.Tensor]
) -> list[tf.Tensor]:
    """Sums `values` with one call of `sum_flat` per dtype.

    The values of one dtype are flattened and concatenated into one vector,
    `sum_flat` sums it (one collective), and the sum is cut back into the
    values' shapes.
    """
    return _packed_by_dtype(values, sum_flat, rows=False)


def _packed_by_dtype(
    values: Sequence[tf.Tensor], flat_fn: Callable[[tf.Tensor], tf.Tensor], rows: bool
) -> list[tf.Tensor]:
    """`flat_fn` of the values of each dtype, packed into one vector; with
    `rows`, `flat_fn` returns one such vector per member, stacked, and so
    does this function for each value.

    Values of known shapes (`BatchNormalization`'s statistics, the losses'
    divisors) are cut and shaped with constants: a packing is then a few ops
    where computed shapes took dozens, in a trace that repeats it for every
    layer.
    """
    values = [tf.convert_to_tensor(v) for v in values]
    out = list(values)
    for dtype in sorted({v.dtype for v in values}, key=lambda d: d.name):
        where = [i for i, v in enumerate(values) if v.dtype == dtype]
        known = all(values[i].shape.is_fully_defined() for i in where)
        flat = [_flat(values[i]) for i in where]
        if len(where) == 1:  # nothing to pack
            pieces = [flat_fn(flat[0])]
        else:
            done = flat_fn(tf.concat(flat, axis=0))
            sizes = (
                [values[i].shape.num_elements() for i in where]
                if known
                else tf.stack([tf.size(values[i]) for i in where])
            )
            pieces = tf.split(done, sizes, num=len(where), axis=int(rows))
        for i, piece in zip(where, pieces):
            out[i] = _shaped(piece, values[i], rows)
    return out


def _flat(value: tf.Tensor) -> tf.Tensor:
    return value if value.shape.rank == 1 else tf.reshape(value, [-1])


def _shaped(piece: tf.Tensor, value: tf.Tensor, rows: bool) -> tf.Tensor:
    """`piece` in the shape of `value`, after one leading axis with `rows`."""
    if value.shape.rank == 1 and value.shape.is_fully_defined():
        return piece  # a vector's piece has its shape already
    if value.shape.is_fully_defined():
        shape = value.shape.as_list()
        return tf.reshape(piece, [-1, *shape] if rows else shape)
    shape = tf.shape(value)
    if rows:
        shaped = tf.reshape(piece, tf.concat([tf.shape(piece)[:1], shape], 0))
        shaped.set_shape(tf.TensorShape([None]).concatenate(value.shape))
    else:
        shaped = tf.reshape(piece, shape)
        shaped.set_shape(value.shape)
    return shaped


class TowerCollectives:
    """Sums a list of tensors over the calls of the traced tower, or gathers
    them (`gather`).

    One collective per dtype (``CollectiveReduceV2``, or for a short vector
    ``CollectiveAllToAllV2``: `exchanges_whole`); the instance keys are
    numbered at trace time, so every call of the function issues the same keys in the
    same order, and the group (key and size) is an input of the call.

    Args:
        group_size: How many calls sum together, an int32 scalar tensor.
        group_key: Their group's key, an int32 scalar tensor.
        first_key: The first of the instance keys the function may use.
        timeout_seconds: How long a collective may wait for the other
            workers' calls; 0 for no limit.
        token: A resource handle that orders the collectives among
            themselves only (`tf.distribute`'s ordering token), or ``None``
            to order them with the function's other stateful ops.
    """

    def __init__(
        self,
        group_size: tf.Tensor,
        group_key: tf.Tensor,
        first_key: int,
        timeout_seconds: float = 0.0,
        token: tf.Tensor | None = None,
    ):
        self.group_size = group_size
        self.group_key = group_key
        self.first_key = first_key
        self.timeout_seconds = timeout_seconds
        self.token = token
        self.used = 0
        self._multiples: tf.Tensor | None = None

    def __call__(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        return sum_by_dtype(values, self.sum_flat)

    def sum_flat(self, flat: tf.Tensor) -> tf.Tensor:
        """`flat`, a vector, summed over the calls with the next key."""
        if not exchanges_whole(flat):
            return tf.raw_ops.CollectiveReduceV2(
                input=flat, merge_op="Add", final_op="Id", **self._next_key()
            )
        # The rows added in the group's order: one round, where a ring
        # takes 2 (N - 1).
        return tf.reduce_sum(self.gather_flat(flat), axis=0)

    def gather(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """Every call's `values`, stacked: each value's rows are the calls'
        in the group's order, the same on every call; one collective per
        dtype (floating point, int32 or int64: `CollectiveAllToAllV2`'s)."""
        return _packed_by_dtype(values, self.gather_flat, rows=True)

    def gather_flat(self, flat: tf.Tensor) -> tf.Tensor:
        """`flat`, a vector, of every call, ``(group_size, k)``, with the
        next key: each call sends its whole vector to every other
        (``CollectiveAllToAllV2`` of `group_size` copies)."""
        copies = tf.tile(tf.expand_dims(flat, 0), self._copies())
        return tf.raw_ops.CollectiveAllToAllV2(input=copies, **self._next_key())

    def _copies(self) -> tf.Tensor:
        """``(group_size, 1)``, made once per graph the collectives are in."""
        graph = tf.compat.v1.get_default_graph()
        if self._multiples is None or self._multiples.graph is not graph:
            self._multiples = tf.stack([self.group_size, 1])
        return self._multiples

    def _next_key(self) -> dict:
        if self.used >= keys.STEP_BLOCK:
            raise RuntimeError(
                f"A tower issued more than {keys.STEP_BLOCK} sums in one step."
            )
        self.used += 1
        return dict(
            group_size=self.group_size,
            group_key=self.group_key,
            instance_key=self.first_key + self.used - 1,
            ordering_token=[] if self.token is None else [self.token],
            timeout_seconds=self.timeout_seconds,
        )


# Sums of at most this many values (`BatchNormalization`'s moments, the
# losses' divisors) wait on latency, not bandwidth.
_EXCHANGED_WHOLE = 1 << 15
_EXCHANGED_DTYPES = (
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.int32,
    tf.int64,
)


def exchanges_whole(flat: tf.Tensor) -> bool:
    """Whether `TowerCollectives` sums `flat` (a vector) by an all-to-all
    exchange of the whole vector, rather than a ring all-reduce.

    A ring sums ``k`` values over ``N`` members in ``2 (N - 1)`` rounds of
    ``k / N`` values each; the exchange in one round of ``(N - 1) k``.
    Between 4 logical CPUs of one process a ring's sum of a few hundred
    values took 320 us, the exchange 200 us (8 CPUs: 730 against 320 us):
    a synchronised ``BatchNormalization`` layer waits on two such
    collectives (`kerastower.step.batch_norm`), one layer after the other.
    Large vectors (gradients) keep the ring.
    """
    size = flat.shape.num_elements()
    return (
        size is not None
        and size <= _EXCHANGED_WHOLE
        and flat.dtype in _EXCHANGED_DTYPES
    )
