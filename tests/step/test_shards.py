"""The pure batch-splitting math."""

import numpy as np
import pytest
import tensorflow as tf

from kerastower.step.shards import (
    even_shard,
    loss_weights,
    split_offsets,
    split_sizes,
    tensor_split_sizes,
    tower_shards,
)


@pytest.mark.parametrize(
    "batch, towers, expected",
    [
        (10, 3, [4, 3, 3]),
        (5, 2, [3, 2]),
        (8, 4, [2, 2, 2, 2]),
        (1, 4, [1, 0, 0, 0]),
        (0, 2, [0, 0]),
        (7, 1, [7]),
    ],
)
def test_split_sizes(batch, towers, expected):
    assert split_sizes(batch, towers) == expected


def test_sizes_sum_to_the_batch_and_differ_by_at_most_one():
    for batch in range(0, 40):
        for towers in range(1, 9):
            sizes = split_sizes(batch, towers)
            assert sum(sizes) == batch and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)


def test_offsets_and_weights():
    assert split_offsets(10, 3) == [0, 4, 7]
    assert loss_weights(10, 4) == [0.3, 0.3, 0.2, 0.2]
    assert sum(loss_weights(33, 4)) == pytest.approx(1.0)


def test_weighted_tower_means_equal_the_global_mean():
    values = np.random.default_rng(0).normal(size=11)
    parts = np.split(values, np.cumsum(split_sizes(11, 3))[:-1])
    weighted = sum(w * p.mean() for w, p in zip(loss_weights(11, 3), parts))
    assert weighted == pytest.approx(values.mean())


def test_tensor_version_matches():
    for batch in (0, 1, 5, 17, 33):
        for towers in (1, 2, 3, 4):
            got = tensor_split_sizes(tf.constant(batch), towers).numpy().tolist()
            assert got == split_sizes(batch, towers)


@pytest.mark.parametrize("towers", [0, -2, 1.5, "3", True])
def test_bad_towers(towers):
    with pytest.raises(ValueError, match=r"`towers` must be an integer >= 1"):
        split_sizes(4, towers)


def test_bad_batch_size():
    with pytest.raises(ValueError, match=r"Received: batch_size=-1"):
        split_sizes(-1, 2)
    with pytest.raises(ValueError, match=r"Received: batch_size=0"):
        loss_weights(0, 2)


@pytest.mark.parametrize(
    "shape, towers, expected",
    [
        ([8, 3], 4, 2),  # a static batch that splits evenly
        ([8, 3], 1, 8),
        ([10, 3], 4, None),  # unevenly: shards of 3 and 2
        ([2, 3], 4, None),  # smaller than the tower count
        ([None, 3], 4, None),  # unknown
    ],
)
def test_even_shard(shape, towers, expected):
    found = []

    @tf.function(input_signature=[tf.TensorSpec(shape, tf.float32)])
    def traced(x):
        found.append(even_shard((None, x), towers))  # the first leaf's batch
        return x

    traced.get_concrete_function()
    assert found == [expected]


@pytest.mark.parametrize(
    "shape, towers, sizes, even, static",
    [
        ([8, 3], 4, [2, 2, 2, 2], True, 2),  # constant sizes, static shards
        ([10, 3], 4, [3, 3, 2, 2], False, None),  # hidden from shape inference
        ([None, 3], 4, [3, 3, 2, 2], False, None),
        ([3, 3], 4, [1, 1, 1, 0], False, None),  # smaller than the tower count
    ],
)
def test_tower_shards(shape, towers, sizes, even, static):
    batch = sum(sizes)
    data = {"x": np.arange(batch * 3, dtype="float32").reshape(batch, 3)}
    data["y"] = np.arange(batch, dtype="int64")
    found = []

    @tf.function(
        input_signature=[
            {
                "x": tf.TensorSpec(shape, tf.float32),
                "y": tf.TensorSpec(shape[:1], tf.int64),
            }
        ]
    )
    def traced(data):
        rows = tf.shape(data["y"])[0]
        shards = tower_shards(data, rows, rows, towers)
        found.append((shards.even, [s["x"].shape[0] for s in shards.shards]))
        return shards.sizes, shards.weights, [s["y"] for s in shards.shards]

    got_sizes, weights, ys = traced(data)
    assert found == [(even, [static] * towers)]
    assert got_sizes.numpy().tolist() == sizes
    assert weights.dtype == tf.float64
    # TensorFlow's float64 division may be an ulp off (3 / 10 gave
    # 0.30000000000000004); cast to float32, it is the rounded share.
    np.testing.assert_allclose(weights.numpy(), np.array(sizes) / batch, rtol=1e-15)
    np.testing.assert_array_equal(
        weights.numpy().astype("float32"), (np.array(sizes) / batch).astype("float32")
    )
    np.testing.assert_array_equal(np.concatenate([y.numpy() for y in ys]), data["y"])
    assert [len(y) for y in ys] == sizes
