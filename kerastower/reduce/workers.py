"""Sums across the workers of a cluster.

Within a worker, `TowerModel` splits its local batch over its local towers.
Across workers the global batch size, the gradients and the metric updates
are summed over workers, so every worker applies the same update to the same
weights; each worker contributes once, whatever its number of towers. A
step's sums are TensorFlow's collective ops over the workers' first towers
(`sum_over_workers`, `gather_slices`), in the cluster that
`tf.distribute.MultiWorkerMirroredStrategy` (made by
`kerastower.worker_strategy`) sets up; the callbacks' sums outside the steps
go through that strategy's own all-reduce (`all_reduce_sum`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Collection, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.reduce import keys, towers
from kerastower.reduce.gradients import merge_rows
from kerastower.workers import cluster, multi_worker


def all_reduce_sum(strategy: tf.distribute.Strategy, values: Any) -> Any:
    """Sums a nest of tensors over the workers of `strategy` (graph or eager).

    Each worker contributes its value once, even when the strategy has several
    local replicas (GPUs) per worker.

    Args:
        strategy: A `MultiWorkerMirroredStrategy`.
        values: A nest of tensors, the same structure on every worker.

    Returns:
        The nest of element-wise sums over workers.
    """
    local = strategy.num_replicas_in_sync // _keras_compat.strategy_num_workers(
        strategy
    )

    def reduce(flat):
        context = tf.distribute.get_replica_context()
        first = tf.equal(context.replica_id_in_sync_group % local, 0)
        mine = [tf.where(first, v, tf.zeros_like(v)) for v in flat]
        # One all-reduce per dtype: TensorFlow packs each call into one buffer.
        out = list(mine)
        for dtype in {v.dtype for v in mine}:
            where = [i for i, v in enumerate(mine) if v.dtype == dtype]
            summed = context.all_reduce(
                tf.distribute.ReduceOp.SUM, [mine[i] for i in where]
            )
            for i, value in zip(where, summed):
                out[i] = value
        return out

    flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(values)]
    summed = strategy.run(reduce, args=(flat,))
    first = [strategy.experimental_local_results(v)[0] for v in summed]
    return tf.nest.pack_sequence_as(values, first)


def sum_over_workers(model: keras.Model, values: Any) -> Any:
    """Sums a nest of tensors over the workers of `model` (identity on one).

    One collective per dtype over the workers' first towers
    (`kerastower.reduce.towers.over_workers`), with the instance keys of
    the step being traced (`kerastower.reduce.keys.worker_key`): the same
    keys at every run and every trace, also inside a loop of several steps
    (``steps_per_execution``). Every worker must call it
    outside the branches of a step, with the same shapes at every run.

    Args:
        model: A `kerastower.TowerModel`.
        values: A nest of tensors, the same structure on every worker.

    Returns:
        The nest of sums over workers.
    """
    if model.num_workers == 1:
        return values
    flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(values)]
    # int32 lives in host memory on GPUs, where a collective cannot take it.
    wide = [tf.cast(v, tf.int64) if v.dtype == tf.int32 else v for v in flat]
    summed = towers.sum_by_dtype(wide, functools.partial(_over_workers, model))
    summed = [tf.cast(s, v.dtype) for s, v in zip(summed, flat)]
    return tf.nest.pack_sequence_as(values, summed)


def _over_workers(model, value, group_key=keys.WORKERS_GROUP_KEY, gather=False):
    return towers.over_workers(
        value,
        model.num_workers,
        model.tower_devices[0],
        keys.worker_key(),
        multi_worker.timeout(),
        group_key,
        gather,
    )


def gather_slices(
    model: keras.Model, slices: Sequence[tf.IndexedSlices]
) -> list[tf.IndexedSlices]:
    """Concatenates each worker's `tf.IndexedSlices`, in worker order.

    The sparse counterpart of `sum_over_workers`: rows stay rows (duplicate
    indices are kept, as one device fed every worker's examples would have
    them), so a large embedding table is never densified. The row counts
    change with the batch and an instance key keeps the shape it first
    gathered, so each worker pads its rows to the bucket of the largest
    count, gathers in that bucket's group (`kerastower.reduce.keys.rows_group`)
    and cuts the padding off.

    Args:
        model: A `kerastower.TowerModel` on several workers.
        slices: This worker's slices, the same number on every worker.

    Returns:
        The gathered slices, the same on every worker.
    """
    workers = model.num_workers
    members = keys.first_towers(workers)
    out = []
    for piece in slices:
        rows = tf.shape(piece.indices, out_type=tf.int64)[0]
        mine = tf.one_hot(worker_rank(model), workers, dtype=tf.int64) * rows
        (counts,) = sum_over_workers(model, [mine])
        with tf.device(model.tower_devices[0]):
            group, length = keys.rows_group(members, tf.reduce_max(counts))
        gathered = []
        for value in (piece.values, tf.cast(piece.indices, tf.int64)):
            pad = [[0, length - rows]] + [[0, 0]] * (value.shape.rank - 1)
            whole = _over_workers(model, tf.pad(value, pad), group, gather=True)
            parts = [whole[j * length : j * length + counts[j]] for j in range(workers)]
            gathered.append(tf.concat(parts, axis=0))
        values, indices = gathered
        indices = tf.cast(indices, piece.indices.dtype)
        out.append(tf.IndexedSlices(values, indices, piece.dense_shape))
    return out


def replica_span(model: keras.Model) -> tuple[int, float]:
    """``(towers, timeout)`` of a ring over every worker's replicas.

    The towers of all workers together (workers may have different numbers),
    from one sum over the workers, run eagerly; and how long a collective
    may wait for the other workers (`kerastower.multi_worker.timeout`).
    """
    with tf.init_scope():
        total = sum_over_workers(model, tf.constant(float(model.num_towers)))
    return int(round(float(total))), multi_worker.timeout()


def worker_rank(model: keras.Model) -> int:
    """This worker's place among the workers of `model`, the chief first."""
    if model.num_workers == 1:
        return 0
    return int(model.worker_strategy.cluster_resolver.task_id)


def worker_batches(model: keras.Model, batch: tf.Tensor) -> tf.Tensor:
    """Every worker's batch and tower count, by one sum over the workers.

    Args:
        model: A `kerastower.TowerModel` on several workers.
        batch: This worker's number of examples, a scalar.

    Returns:
        A ``(2, W)`` float32 tensor: row 0 every worker's batch ``B_w``, row
        1 its towers ``N_w``, the chief's first.
    """
    rank = worker_rank(model)
    mine = tf.stack([tf.cast(batch, tf.float32), float(model.num_towers)])
    return sum_over_workers(
        model, mine[:, None] * tf.one_hot(rank, model.num_workers)[None, :]
    )


def batches_over_workers(
    model: keras.Model, every: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Where this worker's batch starts in the global batch, and its size.

    The global batch is every worker's batch, in worker order (the chief's
    first): one device's batch for the step.

    Args:
        model: A `kerastower.TowerModel` on several workers.
        every: `worker_batches`.

    Returns:
        ``(offset, total)``: the examples of the workers before this one
        (int32) and of all workers (float32).
    """
    batches = every[0]
    rank = worker_rank(model)
    return tf.cast(tf.reduce_sum(batches[:rank]), tf.int32), tf.reduce_sum(batches)


def sum_gradients_over_workers(
    model: keras.Model,
    loss: tf.Tensor,
    gradients: Sequence[Any],
    static_rows: Collection[int] = frozenset(),
) -> tuple[tf.Tensor, list[Any]]:
    """Sums a step's loss and gradients over the workers of `model`.

    Dense gradients are summed. Sparse ones keep their rows (`gather_slices`),
    as one device fed every worker's examples would have them, since Adam and
    friends treat each row on its own; a table every tower gathers whole (its
    index in `static_rows`, see `kerastower.reduce.gradients.has_static_rows`)
    is then merged by index, as one device gathers it once.

    Args:
        model: A `kerastower.TowerModel`.
        loss: This worker's share of the step's loss.
        gradients: This worker's gradients, ``None`` where unconnected.
        static_rows: Indices of `gradients` whose rows are a fixed set.

    Returns:
        ``(loss, gradients)`` over all workers; unchanged on one worker.
    """
    if model.num_workers == 1:
        return loss, gradients
    gradients = list(gradients)
    dense = [j for j, g in enumerate(gradients) if isinstance(g, tf.Tensor)]
    sparse = [j for j, g in enumerate(gradients) if isinstance(g, tf.IndexedSlices)]
    summed = sum_over_workers(model, [loss] + [gradients[j] for j in dense])
    for j, grad in zip(dense, summed[1:]):
        gradients[j] = grad
    if sparse:
        gathered = gather_slices(model, [gradients[j] for j in sparse])
        for j, grad in zip(sparse, gathered):
            gradients[j] = merge_rows(grad) if j in static_rows else grad
    return summed[0], gradients


_SUMMING = threading.local()  # inside a `MetricsOverWorkers`


class MetricsOverWorkers:
    """Makes the metric updates made while open count every worker's examples.

    Keras metrics keep additive state (totals and counts), so summing each
    worker's change of state gives the state of one metric fed every worker's
    examples. Nested uses (the built-in step called from a `train_step` of
    one's own, see `kerastower.step.custom_step.over_workers`) sum once, in
    the outermost. On one worker it does nothing::

        with MetricsOverWorkers(model) as over:
            logs = model.compute_metrics(x, y, y_pred)  # this worker's
        logs = over.logs(logs)

    Args:
        model: A `kerastower.TowerModel`.
    """

    def __init__(self, model: keras.Model):
        self.model = model
        self.summing = model.num_workers > 1 and not getattr(_SUMMING, "active", False)
        self._variables: list = []
        self._before: list = []
        self._order: Any = None

    def __enter__(self) -> MetricsOverWorkers:
        if self.summing:
            self._variables = [v for m in self.model.metrics for v in m.variables]
            self._before = [tf.identity(v) for v in self._variables]
            _SUMMING.active = True
            self._order = tf.control_dependencies(self._before)
            self._order.__enter__()
        return self

    def __exit__(self, kind, error, trace) -> None:
        if not self.summing:
            return
        self._order.__exit__(kind, error, trace)
        _SUMMING.active = False
        if kind is not None:
            return
        variables, before = self._variables, self._before
        deltas = [v - b for v, b in zip(variables, before)]
        summed = sum_over_workers(self.model, deltas)
        for variable, old, delta in zip(variables, before, summed):
            variable.assign(old + delta)

    def logs(self, logs: Any, keep_logs: bool = False) -> Any:
        """The logs of the step, over all workers.

        Args:
            logs: What the step's update returned: the metric results (the
                built-in steps) or a ``train_step``'s logs.
            keep_logs: Whether to keep `logs` (a ``train_step``'s), with
                each entry named after a metric replaced by its result over
                all workers, rather than return the model's metric results.

        Returns:
            `logs` as given on one worker (or nested); else the model's metric
            results over all workers, or, with `keep_logs`, the refreshed logs.
        """
        if not self.summing:
            return logs
        results = self.model.get_metrics_result()
        if not keep_logs:
            return results
        if not isinstance(logs, dict):
            return logs

        def refreshed(entries):
            return {
                name: refreshed(value)
                if isinstance(value, dict)
                else results.get(name, value)
                for name, value in entries.items()
            }

        return refreshed(logs)


def broadcast_from_chief(
    strategy: tf.distribute.Strategy, variables: list[tf.Variable]
) -> None:
    """Gives every worker the chief's values of `variables`.

    Every worker must call it, with the same variables in the same order: the
    values travel by an all-reduce in which the other workers add zeros.

    Args:
        strategy: A `MultiWorkerMirroredStrategy`.
        variables: The same list of variables on every worker.
    """
    if not variables:
        return
    chief = cluster.worker_index_of(cluster.tf_config()) == 0

    @tf.function
    def broadcast():
        mine = [
            tf.identity(v) if chief else tf.zeros(v.shape, v.dtype) for v in variables
        ]
        for variable, value in zip(variables, all_reduce_sum(strategy, mine)):
            variable.assign(value)

    broadcast()


class BroadcastFromChief(keras.callbacks.Callback):
    """Starts every worker from the chief's weights and optimizer state.

    A `keras.callbacks.Callback` that, at the start of `fit`, broadcasts the
    model's and the optimizer's variables from the chief (see
    `broadcast_from_chief`). `TowerModel` adds it to `fit` by itself on a
    multi-worker cluster, after any callback that restores a checkpoint.
    """

    def on_train_begin(self, logs=None):
        model = self.model
        broadcast_from_chief(
            model.worker_strategy,
            list(model.variables) + list(model.optimizer.variables),
        )
