"""Sums over towers: their gradient, and what they cost to trace."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerastower
from kerastower.reduce import keys
from kerastower.reduce.towers import TowerCollectives, sum_over_towers


def test_a_tower_sum_is_its_own_adjoint_to_the_second_order():
    # y_i = (sum_j x_j)^2 on every tower i; L = sum_i w_i y_i. Then
    # dL/dx_k = 2 S sum_i w_i and d2L/dx_k dx_m = 2 sum_i w_i for all k, m.
    strategy = kerastower.TowerStrategy(kerastower.available_devices()[:3])
    xs = [1.0, 2.0, 4.0]
    ws = [0.5, 1.0, 2.0]

    @tf.function
    def step():
        def tower():
            context = tf.distribute.get_replica_context()
            i = context.replica_id_in_sync_group
            x = tf.gather(tf.constant(xs), i)
            w = tf.gather(tf.constant(ws), i)
            with tf.GradientTape() as outer:
                outer.watch(x)
                with tf.GradientTape() as inner:
                    inner.watch(x)
                    (total,) = sum_over_towers([x])
                    loss = w * tf.square(total)
                (first,) = sum_over_towers([inner.gradient(loss, x)])
            second = outer.gradient(first, x)
            return first, second

        first, second = strategy.run(tower)
        return (
            strategy.experimental_local_results(first),
            strategy.experimental_local_results(second),
        )

    first, second = step()
    total, weights = sum(xs), sum(ws)
    # Exact in float32: small integers and powers of two.
    np.testing.assert_array_equal(
        [float(g) for g in first], [3 * 2 * total * weights] * 3
    )
    np.testing.assert_array_equal([float(h) for h in second], [3 * 3 * 2 * weights] * 3)


def test_keys_are_reserved_once_and_groups_are_stable():
    first = keys.reserve(keys.STEP_BLOCK)
    second = keys.reserve()
    assert second == first + keys.STEP_BLOCK
    assert keys.reserve() == second + 1
    devices = ["/device:CPU:0", "/device:CPU:1"]
    assert keys.group_key(devices) == keys.group_key(list(devices))
    assert keys.group_key(devices) != keys.group_key(devices[::-1])
    assert keys.WORKERS_GROUP_KEY not in {keys.group_key(devices)}
    with pytest.raises(ValueError, match=r"`count` must be an integer >= 1"):
        keys.reserve(0)


def test_batch_groups_are_one_per_device_set_and_batch_size():
    # `global_batch_loss`'s gathered predictions change shape with the batch;
    # each batch size gets a group of its own instead of new instance keys
    # at every run (which grew a process by 5 KB a step).
    pair = ["/device:CPU:0", "/device:CPU:1"]
    three = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    groups = {
        (len(devices), batch): int(keys.batch_group_key(devices, tf.constant(batch)))
        for devices in (pair, three)
        for batch in (1, 7, 8, keys.MAX_GROUP_BATCH - 1)
    }
    assert len(set(groups.values())) == len(groups)
    assert int(keys.batch_group_key(list(pair), tf.constant(7))) == groups[(2, 7)]
    plain = {keys.group_key(pair), keys.group_key(three), keys.WORKERS_GROUP_KEY}
    assert not plain & set(groups.values())
    assert all(keys.BATCH_GROUPS <= g < 2 * keys.BATCH_GROUPS for g in groups.values())
    with pytest.raises(tf.errors.InvalidArgumentError, match="fewer than"):
        keys.batch_group_key(pair, tf.constant(keys.MAX_GROUP_BATCH))


def test_row_buckets_pad_little_and_have_one_length_each():
    # The replicas' gathers of sparse rows pad to a bucket of row counts,
    # one collective group per bucket, rather than new keys at every run.
    counts = [*range(300), 1000, 1023, 1024, 1025, 99_999, 2**20 + 1, 2**31 - 1]
    counts += [2**62 - 1, 2**62 + 5]
    length_of = {}
    for n in counts:
        padded, bucket = (int(t) for t in keys.row_bucket(tf.constant(n, tf.int64)))
        assert n <= padded and (padded - n) * 64 < n or padded == n
        assert padded == n or n >= 128
        assert 0 <= bucket < keys.ROW_BUCKETS
        assert length_of.setdefault(bucket, padded) == padded
    assert len(set(length_of.values())) == len(length_of)
    pair = ["/device:CPU:0", "/device:CPU:1"]
    three = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    groups = {
        (len(devices), n): int(keys.rows_group(devices, tf.constant(n, tf.int64))[0])
        for devices in (pair, three)
        for n in (0, 5, 127, 128, 129, 130, 131, 2**40)
    }
    # Above 128 rows, buckets are 2 rows wide: 129 and 130 share one.
    assert groups[(2, 128)] != groups[(2, 129)] == groups[(2, 130)]
    assert groups[(2, 130)] != groups[(2, 131)]
    assert len(set(groups.values())) == len(groups) - 2
    lowest = keys.ROWS_GROUPS
    highest = lowest + keys.MAX_BATCH_GROUP_SETS * keys.ROW_BUCKETS
    assert all(lowest <= g < highest < 2**31 for g in groups.values())
    batches = int(keys.batch_group_key(pair, tf.constant(keys.MAX_GROUP_BATCH - 1)))
    assert batches < lowest


def test_call_groups_name_which_workers_run_their_batch_on_one_tower():
    # Worker w makes N_w calls of its traced tower, or one when B_w < N_w;
    # every worker must find the same size and key from everyone's batches.
    def group(batches, towers):
        size, key = keys.calls_group(tf.constant(batches), tf.constant(towers))
        return int(size), int(key) - keys.CALL_GROUPS

    assert group([4, 4], [2, 3]) == (5, 0)
    assert group([4, 2], [2, 3]) == (3, 0b10)
    assert group([1, 2], [2, 3]) == (2, 0b11)
    assert group([1, 4, 0], [2, 3, 1]) == (5, 0b101)
    assert group([4, 4, 1], [2, 3, 1]) == (6, 0)
    widest = [0] * keys.MAX_TRACED_WORKERS
    assert group(widest, [1] * len(widest)) == (len(widest), 2 ** len(widest) - 1)
    # Apart from the other groups: rows groups end where call groups begin.
    rows_end = keys.ROWS_GROUPS + keys.MAX_BATCH_GROUP_SETS * keys.ROW_BUCKETS
    assert rows_end <= keys.CALL_GROUPS
    assert keys.CALL_GROUPS + 2**keys.MAX_TRACED_WORKERS < keys.WORKERS_GROUP_KEY


def test_every_trace_of_a_step_takes_the_same_keys_over_the_workers():
    # A worker whose step traces again (a batch of a new shape) must take the
    # keys its first trace took, which another worker may still be using.
    owner = object()
    taken = []

    def trace(x):
        with keys.step_keys(owner, "train_step"):
            with keys.step_keys(owner, "test_step"):  # nested: the outer range
                first = keys.worker_key()
            taken.append((first, keys.worker_key(3), keys.worker_key()))
        return x

    function = tf.function(trace)
    function(tf.zeros([4]))
    function(tf.zeros([3]))  # a new shape: traced again
    assert len(taken) == 2 and taken[0] == taken[1]
    first, block, last = taken[0]
    assert (block, last) == (first + 1, first + 4)
    # A new step function (Keras made one): a new range.
    keys.forget_step_keys(owner, "train_step")
    function = tf.function(trace)
    function(tf.zeros([4]))
    assert abs(taken[2][0] - first) >= keys.STEP_KEYS
    # Eager, or outside a step, every key is new.
    assert keys.worker_key() != keys.worker_key()
    with keys.step_keys(owner, "train_step"):
        assert keys.worker_key() != keys.worker_key()


def test_a_step_that_takes_too_many_keys_says_which_constant_to_grow():
    owner = object()

    @tf.function
    def trace():
        with keys.step_keys(owner, "train_step"):
            keys.worker_key(keys.STEP_KEYS)
            keys.worker_key()

    with pytest.raises(RuntimeError, match="STEP_KEYS must grow"):
        trace()


def _conv_bn_stack(depth: int) -> keras.Model:
    x = inputs = keras.Input((4, 4, 2))
    for _ in range(depth):
        x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(x)
        x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def _ops_searched_to_first_step(depth: int, monkeypatch) -> int:
    """How many ops `tf.custom_gradient` walked, looking for variables, while
    the first training step of a `depth` conv-BN stack on 4 towers traced."""
    from tensorflow.python.ops import op_selector

    walked = []
    walk = op_selector.get_backward_walk_ops

    def counting_walk(*args, **kwargs):
        ops = walk(*args, **kwargs)
        walked.append(len(ops))
        return ops

    monkeypatch.setattr(op_selector, "get_backward_walk_ops", counting_walk)
    model = kerastower.TowerModel.from_model(_conv_bn_stack(depth), towers=4)
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((4, 4, 4, 2), "float32"), np.zeros((4, 1), "float32")
    model.train_on_batch(x, y)  # traces the step (the run itself is tiny)
    monkeypatch.undo()
    return sum(walked)


def test_tracing_grows_linearly_with_the_number_of_batch_norm_layers(monkeypatch):
    # Each synchronised BatchNormalization sums its moments over the towers.
    # When a sum's `tf.custom_gradient` searched the graph between its outputs
    # and inputs, the search crossed every other tower's earlier layers, and
    # tracing grew with the square of the depth: 8x the layers took 21x the
    # time to the first step (2.1 s -> 45.7 s); linear, 5.9x (2.1 s -> 12.3
    # s; `python -m bench.trace` times it). Counted here in ops searched,
    # which no load on the machine changes, where a ratio of times failed
    # once under load.
    shallow = _ops_searched_to_first_step(2, monkeypatch)
    deep = _ops_searched_to_first_step(16, monkeypatch)
    # Measured: 288 -> 2304 ops, 8x for 8x the layers; the quadratic search
    # walked 14,536 -> 744,384 (51x). The bound sits between, in log scale.
    assert deep < 20 * max(shallow, 1), (shallow, deep)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_tower_collectives_sum_short_and_long_vectors_alike_on_every_call(dtype):
    # A short vector (BatchNormalization's moments) is exchanged whole between
    # the calls and added in the group's order; a long one (gradients) goes
    # round a ring. Either way every call gets the exact sum.
    from kerastower import _keras_compat

    devices = kerastower.available_devices()[:3]
    group = keys.group_key(devices)
    first_key = keys.reserve(2)
    short, long = 5, (1 << 15) + 1
    made = []

    def tower(a, b):
        collectives = TowerCollectives(tf.constant(3), tf.constant(group), first_key)
        summed = collectives([a]) + collectives([b])
        made.extend(op.type for op in tf.compat.v1.get_default_graph().get_operations())
        return summed

    specs = [tf.TensorSpec([n], dtype) for n in (short, long)]
    noinline = {"_noinline": True}
    call = tf.function(tower, experimental_attributes=noinline).get_concrete_function(
        *specs
    )

    @tf.function
    def step(parts):
        outs = []
        for i, device in enumerate(devices):
            with tf.device(device):
                outs.append(call(*parts[i]))
            for op in {leaf.op for leaf in tf.nest.flatten(outs[-1])}:
                _keras_compat.run_independently(op)
        return outs

    rng = np.random.default_rng(0)
    parts = [
        [rng.integers(-1000, 1000, size=n).astype(dtype) for n in (short, long)]
        for _ in devices
    ]
    outs = step([[tf.constant(p) for p in part] for part in parts])
    assert made.count("CollectiveAllToAllV2") == 1
    assert made.count("CollectiveReduceV2") == 1
    # Integers: every order of addition gives the same sum exactly.
    assert len(outs) == len(devices)
    for a, b in outs:
        np.testing.assert_array_equal(a, sum(p[0] for p in parts))
        np.testing.assert_array_equal(b, sum(p[1] for p in parts))
