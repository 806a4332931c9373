"""`kerastower.AllReduceOptions`: gradient buckets and compression for replicas."""

import keras
import numpy as np
import pytest
from oracle import (
    assert_same_history,
    assert_same_weights,
    max_weight_diff,
    mlp,
    regression_data,
    twin,
)

import kerastower
from kerastower import _keras_compat
from kerastower.reduce import ring, ring_gradients
from kerastower.reduce.ring import AllReduceOptions, buckets


def test_buckets_fill_from_the_last_tensor():
    assert buckets([4, 4, 4, 4], 8) == [[2, 3], [0, 1]]
    assert buckets([10, 1, 1], 4) == [[1, 2], [0]]  # too large: alone
    assert buckets([3, 3], 6) == [[0, 1]]
    assert buckets([], 5) == []


def test_options_are_checked():
    assert AllReduceOptions().bucket_bytes == 25 * 2**20
    with pytest.raises(ValueError, match=r"`bucket_mb` must be a number > 0.*=0"):
        AllReduceOptions(bucket_mb=0)
    with pytest.raises(ValueError, match="`compression` must be None.*'int8'"):
        AllReduceOptions(compression="int8")


def count_sums(monkeypatch):
    """The all-reduces of dense gradients each trace makes: in the step
    (`Ring.sum`), or inside a tower traced once (`sum_in_call`)."""
    original_sum, original_call = ring.Ring.sum, ring_gradients.sum_in_call
    calls = []

    def counted(self, values):
        calls.append("step")
        return original_sum(self, values)

    def counted_in_call(gradients, shapes, sum_flat, *args):
        def summed(flat):
            calls.append("call")
            return sum_flat(flat)

        return original_call(gradients, shapes, summed, *args)

    monkeypatch.setattr(ring.Ring, "sum", counted)
    monkeypatch.setattr(ring_gradients, "sum_in_call", counted_in_call)
    return calls


@pytest.mark.parametrize("bucket_mb", [25, 1e-6])
def test_buckets_train_exactly_as_one_device(bucket_mb, monkeypatch):
    calls = count_sums(monkeypatch)
    x, y = regression_data(n=23)
    options = AllReduceOptions(bucket_mb=bucket_mb)
    plain, towered = twin(mlp, 3, replicate_variables=True, all_reduce=options)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    histories = [
        m.fit(x, y, batch_size=5, epochs=2, verbose=0, shuffle=False).history
        for m in (plain, towered)
    ]
    assert_same_history(*histories)
    assert_same_weights(plain, towered)
    # One all-reduce per trace of the step for all 4 variables, or one each.
    per_trace = 1 if bucket_mb == 25 else len(towered.trainable_weights)
    assert calls and len(calls) % per_trace == 0
    assert len(calls) // per_trace <= 2  # the step traces once, or twice
    # A tower traced once sums its own gradients; copies sum in the step.
    traced_once = _keras_compat.keeps_functions_apart()
    assert set(calls) == {"call" if traced_once else "step"}


@pytest.mark.parametrize("compression", ["float16", "bfloat16"])
def test_compression_rounds_the_sums_only(compression):
    x, y = regression_data(n=40)
    options = AllReduceOptions(compression=compression)
    plain, towered = twin(mlp, 4, replicate_variables=True, all_reduce=options)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    for model in (plain, towered):
        model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    difference = max_weight_diff(plain, towered)
    # Measured after 15 SGD steps, weights of about 0.6: 1.7e-4 (float16) and
    # 5.6e-4 (bfloat16) apart from one device; loss history 1.3e-5 and 1.6e-4
    # relative. Without compression: exact (above).
    bound = {"float16": 5e-4, "bfloat16": 2e-3}[compression]
    assert 0 < difference < bound, difference
    replicas = towered._tower_step.replicas
    for copy, primary in zip(replicas.replica_variables(3), towered.trainable_weights):
        np.testing.assert_array_equal(copy.numpy(), primary.numpy())


def test_options_round_trip(tmp_path):
    options = AllReduceOptions(bucket_mb=4, compression="bfloat16")
    model = kerastower.TowerModel.from_model(mlp(), towers=2, all_reduce=options)
    assert model.get_config()["all_reduce"] == {
        "bucket_mb": 4,
        "compression": "bfloat16",
    }
    model.compile(optimizer="sgd", loss="mse")
    model.save(tmp_path / "m.keras")
    assert keras.models.load_model(tmp_path / "m.keras").all_reduce == options
