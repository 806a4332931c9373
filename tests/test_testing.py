"""`kerastower.testing.compare_with_one_device`: a user's check of their model.

Each model family and option trains in float64 and must come out the same as
one device (about 1e-15 relative here; the verdict's bound is 1e-10); planted
differences must come out DIFFERENT, so the check can fail.
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only

import kerastower
from kerastower.testing import (
    compare_with_one_device,
    relative_difference,
    reorder_batches,
)

TOWERS = 3
# 23 examples in global batches of 8: 8, 8 and 7, cut [3, 3, 2] and [3, 2, 2].
BATCH = 8


def data(n=23, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    y = np.tanh(x @ rng.normal(size=(5, 1)))
    return x, y


def functional(batch_norm=False, **tower_kwargs):
    def build(towers):
        inputs = keras.Input((5,))
        h = keras.layers.Dense(8, activation="tanh")(inputs)
        if batch_norm:
            h = keras.layers.BatchNormalization()(h)
        outputs = keras.layers.Dense(1)(h)
        model = kerastower.TowerModel(inputs, outputs, towers=towers, **tower_kwargs)
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model

    return build


def test_a_functional_model_is_the_one_device_model_in_float64():
    x, y = data()
    report = compare_with_one_device(
        functional(batch_norm=True), x, y, towers=TOWERS, batch_size=BATCH, epochs=2
    )
    assert report.same, report
    assert report.dtype == "float64"
    assert report.steps == 6
    assert len(report.towers) == TOWERS
    assert report.difference < 1e-12, report
    assert report.yardstick is not None and report.yardstick < 1e-12
    assert report.tower_model.num_towers == TOWERS
    assert "same as one device" in str(report)
    assert report.tower_model.weights[0].dtype == "float64"
    assert keras.backend.floatx() == "float32"  # restored


def test_per_tower_batch_statistics_are_reported_different():
    # `sync_batch_norm=False` keeps each tower's own statistics, as stock
    # MirroredStrategy does: not the one-device model.
    x, y = data()
    report = compare_with_one_device(
        functional(batch_norm=True, sync_batch_norm=False),
        x,
        y,
        towers=TOWERS,
        batch_size=BATCH,
    )
    assert not report.same
    assert report.difference > 1e-3, report
    assert "DIFFERENT from one device" in str(report)


def test_a_sequential_model_with_sample_weights():
    x, y = data()
    weights = np.random.default_rng(1).uniform(0.1, 2.0, size=len(x))

    def build(towers):
        keras.utils.set_random_seed(0)
        plain = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(6, "relu"), keras.layers.Dense(1)]
        )
        model = (
            plain if towers == 1 else kerastower.TowerModel.from_model(plain, towers)
        )
        model.compile(optimizer="sgd", loss="mae", weighted_metrics=["mse"])
        return model

    report = compare_with_one_device(
        build, x, y, sample_weight=weights, towers=TOWERS, batch_size=BATCH
    )
    assert report.same, report
    assert report.difference < 1e-12, report
    assert not isinstance(report.one_device_model, kerastower.TowerModel)


class TowerRegressor(kerastower.TowerModel):
    """A subclassed model with its own `train_step` through `tower_gradients`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data

        def loss_fn(x, y):
            return tf.reduce_mean(tf.square(y - self(x, training=True)))

        variables = self.trainable_weights
        grads, loss = self.tower_gradients(loss_fn, variables, x, y)
        self.optimizer.apply_gradients(zip(grads, variables))
        return {"loss": loss}


def test_a_subclassed_model_with_its_own_train_step():
    x, y = data()

    def build(towers):
        model = TowerRegressor(towers=towers)
        model.compile(optimizer="adam")
        return model

    report = compare_with_one_device(build, x, y, towers=TOWERS, batch_size=BATCH)
    assert report.same, report
    assert report.difference < 1e-12, report


@pytest.mark.parametrize(
    "option",
    [
        pytest.param("replicas", marks=keras3_only),
        "jit_compile",
        "accumulation",
    ],
)
def test_the_options_are_the_one_device_model(option):
    x, y = data(n=29)
    kwargs = {"replicate_variables": True} if option == "replicas" else {}
    build = functional(**kwargs)
    if option == "jit_compile":

        def build(towers, plain=build):
            model = plain(towers)
            model.compile(optimizer="adam", loss="mse", jit_compile=True)
            return model

    report = compare_with_one_device(
        build,
        x,
        y,
        towers=TOWERS,
        batch_size=4 if option == "accumulation" else BATCH,
        accumulation_steps=3 if option == "accumulation" else None,
    )
    assert report.same, report
    assert report.difference < 1e-12, report


def test_float32_is_read_against_its_yardstick():
    x, y = data()
    report = compare_with_one_device(
        functional(), x, y, towers=TOWERS, batch_size=BATCH, dtype="float32"
    )
    assert report.dtype == "float32"
    assert report.tower_model.weights[0].dtype == "float32"
    assert report.yardstick is not None
    # Float32 rounding, here or on another CPU, is far above float64's.
    assert report.same, report
    assert report.bound == max(1e-5, 10 * report.yardstick)
    assert "yardstick" in str(report)


def test_reordered_batches_keep_each_batch_and_pair_its_arrays():
    x = np.arange(10)
    reordered = reorder_batches({"x": x, "y": x * 10, "w": None}, batch_size=4)
    assert reordered["w"] is None
    np.testing.assert_array_equal(reordered["y"], reordered["x"] * 10)
    for start in range(0, 10, 4):
        assert sorted(reordered["x"][start : start + 4]) == list(x[start : start + 4])
    assert not np.array_equal(reordered["x"], x)


def test_relative_difference():
    assert relative_difference([1.0, -2.0], [1.0, -2.0]) == 0.0
    assert relative_difference([1.0, -2.5], [1.0, -2.0]) == 0.25
    assert relative_difference([0.0], [0.0]) == 0.0
    assert relative_difference([1e-9], [0.0]) == np.inf
    assert relative_difference([1.0, 2.0], [1.0]) == np.inf
    assert relative_difference([np.nan], [np.nan]) == 0.0
    assert np.isnan(relative_difference([np.nan], [1.0]))


def test_bad_arguments_are_refused():
    x, y = data()
    with pytest.raises(
        ValueError, match=r"`dtype` must be .*Received: dtype='float16'"
    ):
        compare_with_one_device(functional(), x, y, dtype="float16")
    with pytest.raises(
        ValueError, match="`batch_size` must be .*Received: batch_size=0"
    ):
        compare_with_one_device(functional(), x, y, batch_size=0)
    with pytest.raises(ValueError, match="`accumulation_steps` must be"):
        compare_with_one_device(functional(), x, y, accumulation_steps=0)

    def plain(towers):
        inputs = keras.Input((5,))
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
        return model

    with pytest.raises(ValueError, match=r"must return a compiled TowerModel\. Rec"):
        compare_with_one_device(plain, x, y, towers=TOWERS)

    def uncompiled(towers):
        inputs = keras.Input((5,))
        return kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))

    with pytest.raises(ValueError, match="Received: FunctionalTowerModel, not compil"):
        compare_with_one_device(uncompiled, x, y, towers=TOWERS)


@keras3_only  # Keras 2's weights have no path
def test_the_worst_weight_is_named_by_its_path():
    x, y = data()
    report = compare_with_one_device(
        functional(batch_norm=True, sync_batch_norm=False),
        x,
        y,
        towers=TOWERS,
        batch_size=BATCH,
        yardstick=False,
    )
    assert report.yardstick is None
    assert "/" in report.worst_weight
