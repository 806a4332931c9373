"""The tower's step traced once and called on every tower's device.

Tracing a tower copies the model's forward and backward pass into the step's
graph. Traced once per tower, a step holds ``N`` copies, and TensorFlow's
graph optimiser works through each: on ResNet50 with 4 towers the first step
took 8x the plain model's. Here the tower is one `tf.function`, traced once
and called ``N`` times, each call on its tower's device and not inlined
(``_noinline``), and once more, whole, for a batch smaller than the tower
count:

    tower(shard_i, w_i,   i, sizes,          members)  for i in 0 .. N-1
    tower(batch,   B / T, 0, (B, 0, ..., 0), 1)        when B < N

(``T`` is the examples of every worker, ``B`` on one.)

What a tower did differently from another (its place in the batch, whether
it makes the model's assignments) is now an input:

- its index ``i``: the replica id that the step's code reads from
  `tf.distribute.get_replica_context()` while the function traces;
- the sums over the towers (`BatchNormalization`'s moments, the losses'
  divisors) are ``CollectiveReduceV2`` ops inside the function, over the
  calls that run together: ``members`` of them, in the group of their
  devices (`kerastower.reduce.keys.group_key`); on several workers, over
  every worker's calls, in a group named by the workers whose batch runs
  whole on one tower (`kerastower.reduce.keys.calls_group`); with ``global_batch_loss``,
  whose gathered predictions (a sum of ``B`` rows,
  `kerastower.reduce.towers.gather_over_towers`) change shape with the
  batch while an instance key keeps the shape it first summed, in one group
  per batch size (`kerastower.reduce.keys.batch_group_key`);
- with replicas, its replicas' resource handles (tower 0's are the
  model's own variables): the function reads them, on the tower's device,
  and differentiates the values it read; the replicas' updates stay
  outside it;
- every tower reads the model's weights through a `keras.StatelessScope`
  and returns what it would assign (`kerastower.step.layer_updates`); the
  step makes tower 0's assignments after the calls, as the towers traced one
  by one made them.

A call of a function that holds collectives is stateful, and TensorFlow's
automatic control dependencies would run the calls one after the other:
the first tower's sum would wait forever for the others. The calls are
taken out of that order (`kerastower._keras_compat.run_independently`).
The graph optimiser runs once per device on the same function: the calls
skip it (`calls_without_graph_optimizer`), or, reading replicas, get one
round of its passes that speed up kernels (`calls_with_graph_passes`).
The step around them gets one round of Grappler instead of two
(`TowerModel` makes Keras's step functions so:
`kerastower._keras_compat.tensorflow.tower_calls.OptimisedOnce`): the
second round changed nothing and instantiated the tower function again for
every call it might inline. Turned off for the step, Grappler would save
more of the first step, but a fit's steps took up to 17% longer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.reduce import keys
from kerastower.reduce.towers import TowerCollectives
from kerastower.step.shards import tower_shards
from kerastower.workers import multi_worker


def applies(model, workers: int = 1) -> bool:
    """Whether a traced step of `model` on `workers` workers runs its towers
    as one function.

    Towers are traced once without XLA and without Keras 2's random layers
    (whose ops keep the seed they were traced with), and on several workers
    (up to `kerastower.reduce.keys.MAX_TRACED_WORKERS`) without
    ``global_batch_loss``, whose gathers would need a group per
    batch size and set of workers; the other settings trace one copy per
    tower, as does TensorFlow 2.12, whose functions cannot be kept from
    inlining.
    """
    return (
        _keras_compat.keeps_functions_apart()
        and (model.num_towers > 1 or workers > 1)
        and (
            workers == 1
            or (workers <= keys.MAX_TRACED_WORKERS and not model.global_batch_loss)
        )
        and not model.jit_compile
        and not _keras_compat.draws_per_traced_op(_keras_compat.inner_layers(model))
    )


def _unseen(value: Any) -> Any:
    """`value`, as a tensor whose value graph optimisation cannot see."""
    if value is None or isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
        return value
    value = tf.convert_to_tensor(value)
    return tf.compat.v1.placeholder_with_default(value, value.shape)


def _read(handle: tf.Tensor, variable: Any) -> tf.Tensor:
    """The value of the variable whose resource `handle` is given, a replica
    of `variable` (of its shape and dtype), read where it lives."""
    value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=variable.dtype)
    return tf.ensure_shape(value, variable.shape)


def _spec(value: Any) -> Any:
    """The `tf.TypeSpec` of `value` with its batch dimension unknown."""
    spec = tf.type_spec_from_value(value)
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
        shape = tf.TensorShape([None]).concatenate(spec.shape[1:])
        return tf.TensorSpec(shape, spec.dtype)
    return spec


def run(
    model,
    body: Callable,
    frame: Any,
    data: Any,
    batch: tf.Tensor,
    total: tf.Tensor,
    replicated: Sequence[Sequence[Any]] | None = None,
    calls: tuple[tf.Tensor, tf.Tensor] | None = None,
) -> tuple[Callable, Callable]:
    """Traces `body` once; returns the towers' and the one tower's runs.

    Args:
        model: The `kerastower.TowerModel`.
        body: A `kerastower.step.tower_body.TowerBody`: one tower's step on
            its shard, weighted by its share ``n_i / B`` (float64) of the
            batch, traced once inside a replica context whose replica id is
            the calling tower's and whose all-reduce sums over the calls.
        frame: The step's `kerastower.step.tower_context.TowerFrame`, whose
            context (for towers of ``sizes`` examples each, an input of the
            function) the body runs in.
        data: The global batch.
        batch: ``B``, int32.
        total: ``B``, float32 (this worker's examples).
        replicated: With replicas, each tower's replicated variables, tower
            0's (the model's own) first: tower ``i`` passes the resource
            handles of ``replicated[i]``, and the function reads them, where
            they live, so that one trace reads every tower's replicas; the
            body gets the values by ``id`` of tower 0's variable.
        calls: On several workers, ``(group_size, group_key)`` of the calls
            of every worker's towers (`kerastower.reduce.keys.calls_group`),
            in which every sum over the towers spans the workers; ``None``
            on one worker.

    Returns:
        ``(on_towers, on_one_tower)``: functions that call the traced tower
        on every tower or on the first tower with the whole batch, and
        return a list (of ``N`` or of one) of ``(result, updates)``: the
        body's result and what the tower assigned (`body.traced_updates`).
    """
    towers = model.num_towers
    sizes, weights, shards = tower_shards(data, batch, total, towers)
    strategy = model.tower_strategy
    first_key = (
        keys.reserve(keys.STEP_BLOCK)
        if calls is None
        else keys.worker_key(keys.STEP_BLOCK)
    )

    primaries = list(replicated[0]) if replicated else []

    timeout = multi_worker.timeout() if calls is not None else 0.0

    def traced_tower(shard, weight, tower, tower_sizes, group_size, group_key, handles):
        collectives = TowerCollectives(group_size, group_key, first_key, timeout)
        replica_values = (
            {id(v): _read(handle, v) for v, handle in zip(primaries, handles)}
            if replicated
            else None
        )
        with _keras_compat.tower_replica_context(strategy, tower, collectives):
            with frame.towers(tower_sizes) as losses:
                result = frame.call(body, shard, weight, losses, replica_values)
            return result, body.traced_updates()

    function = tf.function(
        traced_tower, autograph=False, experimental_attributes={"_noinline": True}
    )
    int32 = tf.TensorSpec([], tf.int32)
    concrete = function.get_concrete_function(
        tf.nest.map_structure(_spec, shards[0]),
        tf.TensorSpec([], tf.float64),
        int32,
        tf.TensorSpec([towers], tf.int32),
        int32,
        int32,
        [tf.TensorSpec([], tf.resource) for _ in primaries],
    )

    # The groups of the calls that run together: every tower, or the first
    # alone; with `global_batch_loss`, whose sums follow the batch, one per
    # batch size too (made once for the step, not once per call).
    # Over several workers, both run in the one group of the step's calls.
    groups = {
        members: (
            calls
            if calls is not None
            else (
                members,
                keys.batch_group_key(model.tower_devices[:members], batch)
                if model.global_batch_loss
                else keys.group_key(model.tower_devices[:members]),
            )
        )
        for members in (towers, 1)
    }

    # Grappler optimises each call's instantiation, once per device. Towers
    # reading the model's variables skip it: on ResNet50 it cost 0.4 s of
    # the first step per call, for steady steps within the noise. Towers
    # reading their replicas get one round of its passes that speed up
    # kernels (all of them, twice, cost 1.4 times as long, for steady
    # steps as long): their first step waits on the replicas' updates, and
    # Grappler took 15-20% off their steady step (the Transformer of
    # bench.trace).
    passes = _keras_compat.kernel_passes(model.tower_devices) if replicated else ()

    def graph_passes():
        if not passes:
            return _keras_compat.calls_without_graph_optimizer()
        return _keras_compat.calls_with_graph_passes(passes)

    def call(tower, shard, weight, tower_sizes, members):
        group_size, group = groups[members]
        args = (shard, weight, tower, tower_sizes, group_size, group)
        # Grappler specialises a function for each call whose inputs are
        # constants, and optimises each specialisation: unseen, they are not.
        args = tf.nest.map_structure(_unseen, args)
        handles = [v.handle for v in replicated[tower]] if replicated else []
        with tf.device(model.tower_devices[tower]), graph_passes():
            result = concrete(*args, handles)
        calls = {
            leaf.op
            for leaf in tf.nest.flatten(result, expand_composites=True)
            if leaf.op.type in ("StatefulPartitionedCall", "PartitionedCall")
        }
        for op in calls:
            _keras_compat.run_independently(op)
        return result

    def on_towers():
        return [call(i, shards[i], weights[i], sizes, towers) for i in range(towers)]

    def on_one_tower():
        whole = tf.concat([tf.reshape(batch, [1]), tf.zeros([towers - 1], tf.int32)], 0)
        weight = tf.cast(batch, tf.float64) / tf.cast(total, tf.float64)
        return [call(0, data, weight, whole, 1)]

    return on_towers, on_one_tower
