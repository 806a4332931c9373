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
  divisors) are collectives inside the function (short vectors exchanged
  whole, `kerastower.reduce.towers.exchanges_whole`), over the calls that
  run together: ``members`` of them, in the group of their
  devices (`kerastower.reduce.keys.group_key`); on several workers, over
  every worker's calls, in a group named by the workers whose batch runs
  whole on one tower (`kerastower.reduce.keys.calls_group`); with ``global_batch_loss``,
  whose gathered predictions (a sum of ``B`` rows,
  `kerastower.reduce.towers.gather_over_towers`) change shape with the
  batch while an instance key keeps the shape it first summed, in one group
  per batch size (`kerastower.reduce.keys.batch_group_key`);
- the weights it differentiates: with replicas, its replicas' resource
  handles (tower 0's are the model's own variables), which the function
  reads on the tower's device; without (Keras 3), the values of the model's
  trainable weights, which the step reads once, on the first tower's
  device where they live. So are the states of Keras's seed generators
  and a `keras.optimizers.LossScaleOptimizer`'s scale, on both paths.
  A function that read them there itself would run in two parts on each
  other tower, one on the first tower's device to read them, with a send
  of each weight's handle and value within every call: the Transformer of
  `bench.steady` took 1.18 times the copies design's steady step (1.00
  with the values given). A call starts once all its inputs have arrived,
  so on GPUs without replicas (not the default there) a tower's first
  layers wait for every weight's copy. The function differentiates the
  values it was given or read; the replicas' updates stay outside it;
- on one worker of Keras 3, whether it runs: every tower is called at
  every step (`Runs.on_every_tower`), and for a batch smaller than the tower count
  every tower runs the first tower's whole-batch call, its statistics its
  own; the step keeps the first's results alone then
  (`kerastower.step.tower_runs`). A batch of a static size that the towers
  divide is never that small: the function is traced for its shards'
  static size (its shapes known, not computed at run time). With
  replicas, each call also sums its dense gradients over every tower
  (`ring_gradients.sum_in_call`, one collective per bucket), to which
  those that do not run add nothing. The
  calls stand outside any `tf.cond`: in one on the batch size, every
  weight the calls read and every gradient they return would go through
  both branches (ResNet50 on 4 towers: 13% of the step's traced ops; on 8
  towers with replicas, most of the first step's tracing);
- every tower reads the model's weights through a `keras.StatelessScope`
  and returns what it would assign (`kerastower.step.layer_updates`); the
  step makes tower 0's assignments after the calls, as the towers traced one
  by one made them.

A call of a function that holds collectives is stateful, and TensorFlow's
automatic control dependencies would run the calls one after the other:
the first tower's sum would wait forever for the others. The calls are
taken out of that order (`kerastower._keras_compat.run_independently`);
outside a `tf.cond`, which orders them as a whole, two barriers
(`kerastower._keras_compat.resource_barrier`) run them after the step's
writes to what they read and the next writes after them.
The graph optimiser would run once per device on the same function: the
function's body gets one round of its passes that speed up kernels
(`kernel_passes`) once, for a device of the towers' type
(`kerastower._keras_compat.optimised_once`), and the calls skip it
(`calls_without_graph_optimizer`). The step around them gets one round of
Grappler instead of two, without its function optimiser (`TowerModel`
makes Keras's step functions so:
`kerastower._keras_compat.tensorflow.tower_calls.OptimisedOnce`): the
second round changed nothing, and the function optimiser made the tower
function's body again for every call, to find it not to be inlined.
Turned off for the step, Grappler would save more of the first step, but
a fit's steps took up to 17% longer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.reduce import keys, ring_gradients
from kerastower.reduce.replicas import Replicas
from kerastower.reduce.towers import TowerCollectives
from kerastower.step.shards import split_nest, tower_shards
from kerastower.workers import multi_worker


def applies(model, workers: int = 1) -> bool:
    """Whether a traced step of `model` on `workers` workers runs its towers
    as one function.

    Towers are traced once without XLA and without Keras 2's random layers
    (whose ops keep the seed they were traced with), and on several workers
    (up to `kerastower.reduce.keys.MAX_TRACED_WORKERS`) without
    ``global_batch_loss``, whose gathers would need a group per
    batch size and set of workers; the other settings trace one copy per
    tower, as do TensorFlow 2.12, whose functions cannot be kept from
    inlining, and 2.13 and 2.14, whose functions cannot be optimised once
    (`kerastower._keras_compat.keeps_functions_apart`).
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
    return _keras_compat.unseen(value)


def _read(handle: tf.Tensor, variable: Any) -> tf.Tensor:
    """The value of the variable whose resource `handle` is given, a replica
    of `variable` (of its shape and dtype), read where it lives."""
    value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=variable.dtype)
    value.set_shape(variable.shape)  # the replica's: no op to check it
    return value


def _spec(value: Any) -> Any:
    """The `tf.TypeSpec` of `value` with its batch dimension unknown."""
    spec = tf.type_spec_from_value(value)
    if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
        shape = tf.TensorShape([None]).concatenate(spec.shape[1:])
        return tf.TensorSpec(shape, spec.dtype)
    return spec


class Runs(NamedTuple):
    """The ways of calling the tower traced by `run`.

    Attributes:
        on_towers: Calls it on every tower's shard (on several workers
            and on Keras 2, in a `tf.cond` on the batch size).
        on_one_tower: Calls it on the first tower with the whole batch
            (the cond's other branch).
        on_every_tower: ``on_every_tower(small)``, on one worker of Keras 3
            (and anywhere, ``on_every_tower(None)``, where the batch splits
            evenly): calls it on every tower, with the whole batch on the
            first when `small` (a bool scalar) and on the others too, whose
            results then count for nothing (with replicas, their gradients
            add nothing to the sums inside); with `small` ``None``, each
            tower on its shard.
        even: Whether the batch splits evenly (`Shards.even`): the function
            is traced for its shards' static size, which only `on_towers`
            and ``on_every_tower(None)`` pass.

    Each returns a list (of ``N`` or of one) of ``(result, updates)``: the
    body's result and what the tower assigned (`body.traced_updates`).
    """

    on_towers: Callable[..., list]
    on_one_tower: Callable[[], list]
    on_every_tower: Callable[[tf.Tensor | None], list]
    even: bool


def run(
    model,
    body: Callable,
    frame: Any,
    data: Any,
    batch: tf.Tensor,
    total: tf.Tensor,
    replicas: Replicas | None = None,
    calls: tuple[tf.Tensor, tf.Tensor] | None = None,
    sums_gradients: bool = False,
) -> Runs:
    """Traces `body` once; returns the ways of calling it (`Runs`).

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
        replicas: The model's `kerastower.reduce.replicas.Replicas`, made,
            or ``None``: tower ``i`` passes the resource handles of its
            replicated variables (tower 0's are the model's own), and the
            function reads them, where they live, so that one trace reads
            every tower's replicas; without, every tower passes the values
            of the model's trainable weights, read once. The body gets the
            values by ``id`` of the model's variable.
        calls: On several workers, ``(group_size, group_key)`` of the calls
            of every worker's towers (`kerastower.reduce.keys.calls_group`),
            in which every sum over the towers spans the workers; ``None``
            on one worker.
        sums_gradients: With `replicas`, a `kerastower.step.tower_body.Gradients`
            body and one worker: each call sums its dense gradients over
            every tower inside the function, as `replicas` all-reduce them
            (`ring_gradients.sum_in_call`), ordered by its tower's token
            (`Replicas.tokens`), and the step calls it with
            `Runs.on_every_tower`.
    """
    towers = model.num_towers
    devices = model.tower_devices
    sizes, weights, shards, even = tower_shards(data, batch, total, towers)
    strategy = model.tower_strategy
    first_key = (
        keys.reserve(keys.STEP_BLOCK)
        if calls is None
        else keys.worker_key(keys.STEP_BLOCK)
    )
    ring_key = keys.reserve(keys.STEP_BLOCK) if sums_gradients else 0
    replicated = (
        [replicas.replica_variables(i) for i in range(towers)] if replicas else None
    )
    primaries = list(replicated[0]) if replicated else []
    # Read once by the step, where they live: the seed generators' states,
    # a loss-scale optimizer's scale and, without replicas, the weights.
    # Keras 2's layers read the model's variables themselves (no
    # `keras.StatelessScope` maps their reads).
    read = []
    if not _keras_compat.assigns_in_towers():
        read = [
            *([] if replicated else model.trainable_weights),
            *body.state.seeds,
            *body.state.scales,
        ]
    values = [tf.convert_to_tensor(v) for v in read]
    tokens = [t.handle for t in replicas.tokens] if sums_gradients else []

    timeout = multi_worker.timeout() if calls is not None else 0.0

    def summed(result, runs, token):
        # A `Gradients` body's result: its gradients first.
        gradients, *rest = result
        ring = TowerCollectives(towers, keys.group_key(devices), ring_key, token=token)
        shapes = [body.variables[j].shape for j in body.connected]
        gradients = ring_gradients.sum_in_call(
            gradients, shapes, ring.sum_flat, replicas.options, runs
        )
        return (gradients, *rest)

    def traced_tower(
        shard,
        weight,
        tower,
        tower_sizes,
        group_size,
        group_key,
        runs,
        handles,
        token,
        read_values,
    ):
        collectives = TowerCollectives(group_size, group_key, first_key, timeout)
        given_values = {id(v): _read(h, v) for v, h in zip(primaries, handles)}
        given_values.update(zip(map(id, read), read_values))
        with _keras_compat.tower_replica_context(strategy, tower, collectives):
            with frame.towers(tower_sizes, collectives.gather) as losses:
                result = frame.call(body, shard, weight, losses, given_values)
        if sums_gradients:
            result = summed(result, runs, token[0])
        return result, body.traced_updates()

    function = tf.function(
        traced_tower, autograph=False, experimental_attributes={"_noinline": True}
    )
    int32 = tf.TensorSpec([], tf.int32)
    concrete = function.get_concrete_function(
        tf.nest.map_structure(tf.type_spec_from_value if even else _spec, shards[0]),
        tf.TensorSpec([], tf.float64),
        int32,
        tf.TensorSpec([towers], tf.int32),
        int32,
        int32,
        tf.TensorSpec([], tf.bool),
        [tf.TensorSpec([], tf.resource) for _ in primaries],
        [tf.TensorSpec([], tf.resource) for _ in tokens[:1]],
        [tf.TensorSpec(v.shape, v.dtype) for v in values],
    )

    def group_of(members: Sequence[str]):
        # With `global_batch_loss`, whose sums follow the batch, one group
        # per batch size too (made once for the step, not once per call).
        # Over several workers, every call is in the one group of the
        # step's calls.
        if calls is not None:
            return calls
        if model.global_batch_loss:
            return len(members), keys.batch_group_key(members, batch)
        return len(members), keys.group_key(members)

    # The groups of the calls that run together: every tower, or the first
    # alone.
    groups = {members: group_of(devices[:members]) for members in (towers, 1)}

    # Grappler would optimise each call's instantiation, once per device
    # (0.7 s a call on the Transformer of bench.trace). The function gets
    # one round of its passes that speed up kernels, once, and its calls
    # none.
    optimised = _keras_compat.optimised_once(
        concrete, devices[0], _keras_compat.kernel_passes(devices)
    )

    def call(tower, args, made=None):
        # Grappler specialises a function for each call whose inputs are
        # constants, and optimises each specialisation: unseen, they are not.
        args = tf.nest.map_structure(_unseen, args)
        # TensorFlow would convert the function's body twice per call, each
        # time it instantiates the step, to look for reference variables.
        _keras_compat.skip_reference_variable_check(args[1])  # the weight
        handles = [v.handle for v in replicated[tower]] if replicated else []
        with (
            tf.device(devices[tower]),
            _keras_compat.calls_without_graph_optimizer(),
            _keras_compat.calls_without_shape_inference(),
        ):
            result = optimised(*args, handles, tokens[tower : tower + 1], values)
        calls = {
            leaf.op
            for leaf in tf.nest.flatten(result, expand_composites=True)
            if _keras_compat.is_function_call(leaf.op)
        }
        for op in calls:
            _keras_compat.run_independently(op)
        if made is not None:
            made.extend(calls)
        return result

    def on_towers(made=None):
        return [
            call(i, (shards[i], weights[i], i, sizes, *groups[towers], True), made)
            for i in range(towers)
        ]

    def whole():  # the sizes of a batch run whole on the first tower
        return tf.concat([tf.reshape(batch, [1]), tf.zeros([towers - 1], tf.int32)], 0)

    def on_one_tower():
        weight = tf.cast(batch, tf.float64) / tf.cast(total, tf.float64)
        return [call(0, (data, weight, 0, whole(), *groups[1], True))]

    def on_every_tower(small):
        # When `small` (a bool scalar, or None where the batch splits
        # evenly), every tower runs the first tower's call of
        # `on_one_tower` (the whole batch, tower 0, its statistics its own:
        # in a group of its device alone) and adds nothing but the first.
        # Out of a `tf.cond`, the calls are ordered after the step's writes
        # to what they read, and its next writes after them, by barriers.
        resources = [t for t in concrete.captured_inputs if t.dtype == tf.resource]
        resources += [v.handle for variables in replicated or () for v in variables]
        resources += tokens
        before = _keras_compat.resource_barrier(resources)
        made: list = []
        with tf.control_dependencies([before]):
            out = on_towers(made) if small is None else _every_call(small, made)
        with tf.control_dependencies(made):
            _keras_compat.resource_barrier(resources)
        return out

    def _every_call(small, made):
        every_sizes = tf.where(small, whole(), sizes)
        every_weights = tf.cast(every_sizes, tf.float64) / tf.cast(total, tf.float64)
        every_shards = split_nest(data, every_sizes, towers)
        out = []
        for i in range(towers):
            shard = every_shards[0]
            if i > 0:
                shard = tf.cond(
                    small, lambda: every_shards[0], lambda i=i: every_shards[i]
                )
            alone = group_of(devices[i : i + 1])
            weight = tf.where(small, every_weights[0], every_weights[i])
            args = (
                shard,
                weight,
                tf.where(small, 0, i),
                every_sizes,
                tf.where(small, alone[0], towers),
                tf.where(small, alone[1], groups[towers][1]),
                tf.logical_or(tf.logical_not(small), i == 0),
            )
            out.append(call(i, args, made))
        return out

    return Runs(on_towers, on_one_tower, on_every_tower, even)
