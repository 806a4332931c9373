"""TowerModel gives the same weights, losses, metrics and predictions as one device."""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_2, keras
from oracle import (
    assert_close,
    assert_same_history,
    assert_same_weights,
    fit_and_compare,
    fit_twins,
    mlp,
    regression_data,
    twin,
)

import kerastower


@pytest.mark.parametrize("towers", [2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 5, 8, 10])
def test_fit_matches_one_device_for_any_batch_size(towers, batch_size):
    x, y = regression_data(n=23)
    fit_and_compare(
        mlp,
        x,
        y,
        lambda: dict(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"]),
        towers=towers,
        evaluate=False,
        batch_size=batch_size,
        epochs=2,
    )


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
        lambda: keras.optimizers.RMSprop(0.01),
        lambda: keras.optimizers.Adam(0.05, clipnorm=0.1),
        lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.05),
    ],
    ids=["momentum", "adam", "adamw", "rmsprop", "clipnorm", "global_clipnorm"],
)
def test_stateful_optimizers_and_clipping_act_on_the_all_reduced_gradient(optimizer):
    x, y = regression_data(n=21)
    fit_and_compare(
        mlp,
        x,
        y,
        lambda: dict(optimizer=optimizer(), loss="mse"),
        evaluate=False,
        batch_size=8,
        epochs=3,
    )


def test_one_example_on_four_towers_leaves_three_towers_empty():
    x, y = regression_data(n=3)
    fit_and_compare(
        mlp,
        x,
        y,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"]
        ),
        towers=4,
        evaluate=False,
        batch_size=1,
        epochs=2,
    )


def test_regularization_losses_are_counted_once():
    x, y = regression_data(n=19)

    def build():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(
            6,
            kernel_regularizer=keras.regularizers.L2(0.1),
            activity_regularizer=keras.regularizers.L1(0.01),
        )(inputs)
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    fit_and_compare(
        build,
        x,
        y,
        lambda: dict(optimizer=keras.optimizers.SGD(0.05), loss="mse"),
        evaluate=False,
        batch_size=7,
        epochs=2,
    )


def test_sample_weight_and_class_weight():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(22, 4)).astype("float32")
    labels = rng.integers(0, 3, size=(22,))
    weights = rng.uniform(0.1, 2.0, size=(22,)).astype("float32")

    def build():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(inputs))

    def compile_kwargs():
        return dict(
            optimizer=keras.optimizers.Adam(0.02),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            weighted_metrics=["accuracy"],
        )

    fit_and_compare(
        build,
        x,
        labels,
        compile_kwargs,
        towers=4,
        evaluate=False,
        sample_weight=weights,
        batch_size=9,
        epochs=2,
    )
    fit_and_compare(
        build,
        x,
        labels,
        compile_kwargs,
        evaluate=False,
        class_weight={0: 1.0, 1: 3.0, 2: 0.5},
        batch_size=10,
        epochs=2,
    )


def test_multi_input_multi_output_with_dict_losses_and_loss_weights():
    rng = np.random.default_rng(4)
    xa = rng.normal(size=(17, 3)).astype("float32")
    xb = rng.normal(size=(17, 2)).astype("float32")
    ya = rng.normal(size=(17, 1)).astype("float32")
    yb = rng.integers(0, 2, size=(17, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(5)
        a = keras.Input((3,), name="a")
        b = keras.Input((2,), name="b")
        h = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([a, b]))
        out_r = keras.layers.Dense(1, name="reg")(h)
        out_c = keras.layers.Dense(1, activation="sigmoid", name="cls")(h)
        return keras.Model({"a": a, "b": b}, {"reg": out_r, "cls": out_c})

    plain, towered, (_, hb) = fit_and_compare(
        build,
        {"a": xa, "b": xb},
        {"reg": ya, "cls": yb},
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss={"reg": "mse", "cls": "binary_crossentropy"},
            loss_weights={"reg": 0.3, "cls": 2.0},
            metrics={"cls": ["accuracy"], "reg": ["mae"]},
        ),
        evaluate=False,
        batch_size=5,
        epochs=2,
    )
    assert "reg_loss" in hb and "cls_accuracy" in hb
    pa = plain.predict({"a": xa, "b": xb}, batch_size=4, verbose=0)
    pb = towered.predict({"a": xa, "b": xb}, batch_size=4, verbose=0)
    for key in pa:
        assert_close(pa[key], pb[key])


class CustomLossModel(keras.Model):
    """A subclassed model with a compute_loss that does its own math."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(
            1, kernel_regularizer=keras.regularizers.L2(0.05)
        )

    def call(self, x):
        return self.dense(x)

    def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
        loss = tf.reduce_mean(tf.abs(y - y_pred) ** 1.5)
        return loss + tf.add_n([tf.reduce_sum(v) for v in self.losses])


class TowerCustomLossModel(kerastower.TowerModel, CustomLossModel):
    pass


def test_subclassed_model_with_compute_loss_override():
    x, y = regression_data(n=21)
    results = []
    for cls, kwargs in ((CustomLossModel, {}), (TowerCustomLossModel, {"towers": 4})):
        keras.utils.set_random_seed(7)
        model = cls(**kwargs)
        model.compile(optimizer=keras.optimizers.Adam(0.05))
        history = model.fit(x, y, batch_size=6, epochs=3, verbose=0, shuffle=False)
        results.append((model, history.history))
    (plain, ha), (towered, hb) = results
    assert_same_history(ha, hb)
    assert_same_weights(plain, towered)


@pytest.mark.parametrize(
    "towers, batch_size, eagerly",
    [(2, 9, False), (4, 9, False), (4, 8, False), (2, 9, True)],
    ids=["2", "4", "4-even", "2-eagerly"],
)
def test_batch_normalization_is_synchronised_by_default(
    towers, batch_size, eagerly, float64
):
    # Batches of 9, 9 and 4 (shards of a batch size the trace does not
    # know: the count computed at run time), or of 8 (shards of 2, known
    # to the first trace: a constant count); eagerly, `tf.custom_gradient`
    # copies the statistics on its eager path.
    x, y = regression_data(n=22 if batch_size == 9 else 16)

    def build():
        keras.utils.set_random_seed(8)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(6)(inputs)
        h = keras.layers.BatchNormalization()(h)
        return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.ReLU()(h)))

    _, towered, _ = fit_and_compare(
        build,
        x,
        y,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.05), loss="mse", run_eagerly=eagerly
        ),
        towers=towers,
        evaluate=False,
        batch_size=batch_size,
        epochs=2,
        rtol=1e-12,  # float64: rounding, sums in another order
        atol=1e-12,
    )
    bn = [layer for layer in towered.layers if "batch_normalization" in layer.name]
    assert bn[0].synchronized is False  # the layer's own setting is restored


def test_batch_normalization_opt_out_uses_per_tower_statistics():
    x, y = regression_data(n=16)

    def build():
        keras.utils.set_random_seed(8)
        inputs = keras.Input((5,))
        h = keras.layers.BatchNormalization()(keras.layers.Dense(6)(inputs))
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    plain, towered, _ = fit_twins(
        build,
        x,
        y,
        lambda: dict(optimizer=keras.optimizers.SGD(0.1), loss="mse"),
        towers=2,
        tower_kwargs=dict(sync_batch_norm=False),
        batch_size=8,
        epochs=1,
    )
    diffs = [
        np.abs(a - b).max() for a, b in zip(plain.get_weights(), towered.get_weights())
    ]
    assert max(diffs) > 1e-4  # per-tower statistics differ from the global ones


@pytest.mark.parametrize("towers", [2, 3])
def test_evaluate_matches_one_device(towers):
    x, y = regression_data(n=23)
    plain, towered = twin(mlp, towers)
    for model in (plain, towered):
        model.compile(optimizer="sgd", loss="mse", metrics=["mae", "mse"])
    for batch_size in (1, 4, 7, 32):
        a = plain.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        b = towered.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        assert a.keys() == b.keys()
        for key in a:
            assert_close(a[key], b[key])


def test_predict_preserves_values_and_order_for_arrays_and_datasets():
    x, _ = regression_data(n=23)
    plain, towered = twin(mlp, 4)
    expected = plain.predict(x, batch_size=5, verbose=0)
    assert_close(towered.predict(x, batch_size=5, verbose=0), expected)
    dataset = tf.data.Dataset.from_tensor_slices(x).batch(6)
    assert_close(towered.predict(dataset, verbose=0), expected)
    # Order: a model that returns its input returns the inputs in order.
    inputs = keras.Input((5,))
    identity = kerastower.TowerModel(inputs, keras.layers.Identity()(inputs), towers=3)
    np.testing.assert_array_equal(identity.predict(x, batch_size=7, verbose=0), x)


@pytest.mark.parametrize(
    "data_kind", ["dataset", "pydataset", "validation_split", "steps_per_execution"]
)
def test_input_kinds_and_options(data_kind):
    x, y = regression_data(n=24)
    compile_kwargs = dict(loss="mse", metrics=["mae"])
    fit_kwargs = dict(epochs=2)
    data = (x, y)
    if data_kind == "dataset":
        data = (tf.data.Dataset.from_tensor_slices((x, y)).batch(7), None)
        fit_kwargs["validation_data"] = tf.data.Dataset.from_tensor_slices(
            (x, y)
        ).batch(5)
    elif data_kind == "pydataset":

        class Batches(keras.utils.Sequence if KERAS_2 else keras.utils.PyDataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return x[i * 7 : (i + 1) * 7], y[i * 7 : (i + 1) * 7]

        data = (Batches(), None)
    elif data_kind == "validation_split":
        fit_kwargs.update(batch_size=5, validation_split=0.25)
    else:
        compile_kwargs["steps_per_execution"] = 3
        fit_kwargs.update(batch_size=5, validation_data=(x, y))
    fit_and_compare(
        mlp,
        *data,
        lambda: dict(optimizer=keras.optimizers.Adam(0.01), **compile_kwargs),
        evaluate=False,
        **fit_kwargs,
    )


def test_jit_compile():
    x, y = regression_data(n=20)
    fit_and_compare(
        mlp,
        x,
        y,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=True
        ),
        towers=2,
        evaluate=False,
        batch_size=6,
        epochs=2,
    )


@pytest.mark.parametrize("towers", [2, 4])
def test_sum_reduced_losses_add_up_unweighted(towers):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(19, 3)).astype("float32")
    ya = rng.normal(size=(19, 1)).astype("float32")
    yb = rng.normal(size=(19, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(9)
        inputs = keras.Input((3,))
        h = keras.layers.Dense(4, kernel_regularizer="l2")(inputs)
        return keras.Model(
            inputs,
            {
                "a": keras.layers.Dense(1, name="a")(h),
                "b": keras.layers.Dense(1, name="b")(h),
            },
        )

    fit_and_compare(
        build,
        x,
        {"a": ya, "b": yb},
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.01),
            loss={
                "a": keras.losses.MeanSquaredError(reduction="sum"),
                "b": keras.losses.MeanAbsoluteError(),
            },
        ),
        towers=towers,
        evaluate=False,
        batch_size=5,
        epochs=2,
    )


def _digits_step(build, towers=2, batch_size=30):
    """One SGD step of `build()` on the first digits, plain and on towers."""
    from kerastower.cli.demo import load_digits

    (x, y), _ = load_digits(seed=0)
    x, y = x[:batch_size], y[:batch_size]
    plain, towered = twin(build, towers=towers)
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.SGD(1.0),
            loss="sparse_categorical_crossentropy",
        )
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return plain, towered


def test_the_demos_convnet_takes_one_devices_step():
    from kerastower.cli.demo import build_convnet

    plain, towered = _digits_step(lambda: build_convnet(seed=0))
    assert_same_weights(plain, towered)


def _max_pooled_convnet():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Dense(10)(keras.layers.Flatten()(h))
    return keras.Model(inputs, keras.layers.Softmax()(h))


def test_max_pooling_after_batch_normalization_in_float64(float64):
    # In float32, a window whose two largest values are within rounding can
    # send its gradient to the other one on towers (TensorFlow 2.16.2: one
    # window in 15,360, kernels' gradient 0.4% to 2% off; docs/concepts.md).
    # In float64 the rounding is 1e-16 and the step is one device's.
    plain, towered = _digits_step(_max_pooled_convnet)
    assert_same_weights(plain, towered, rtol=1e-12, atol=1e-12)
