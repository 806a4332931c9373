"""``replicate_variables=True`` trains exactly as one device, replicas in sync."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import (
    assert_close,
    assert_same_history,
    assert_same_weights,
    mlp,
    regression_data,
    twin,
)
from replica_checks import (
    assert_replicas_in_sync,
    assert_trains_as_one_device,
    batch_norm_model,
    compile_both,
    embedding_model,
    fit_pair,
    spy,
)

from kerastower.reduce import keys, ring, ring_gradients
from kerastower.reduce.replicas import Replicas
from kerastower.reduce.ring import AllReduceOptions, pack, unpack


@pytest.mark.parametrize("towers", [2, 4])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 10])
@pytest.mark.parametrize(
    "optimizer",
    [keras.optimizers.SGD(0.05, momentum=0.9), keras.optimizers.Adam(0.01)],
    ids=["sgd", "adam"],
)
def test_mlp_matches_one_device(towers, batch_size, optimizer, float64):
    # 23 examples: uneven shards, a short last batch, and (batch 1 and 3 on
    # four towers) batches smaller than the tower count.
    x, y = regression_data(n=23)
    plain, towered = twin(mlp, towers, replicate_variables=True)
    compile_both(plain, towered, optimizer)
    assert_trains_as_one_device(plain, towered, x, y, batch_size=batch_size, epochs=2)


@pytest.mark.parametrize(
    "options",
    [
        dict(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))),
        dict(optimizer=keras.optimizers.Adam(0.01), run_eagerly=True),
    ],
    ids=["loss_scale", "run_eagerly"],
)
def test_loss_scale_optimizer_and_eager_steps(options):
    options = dict(options)
    optimizer = options.pop("optimizer")
    x, y = regression_data(n=23)
    plain, towered = twin(mlp, 4, replicate_variables=True)
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.get(keras.optimizers.serialize(optimizer)),
            loss="mse",
            **options,
        )
    assert_trains_as_one_device(plain, towered, x, y, batch_size=6, epochs=2)


def test_multi_epoch_fit_with_validation_evaluate_and_predict():
    x, y = regression_data(n=40)
    xv, yv = regression_data(n=13, seed=1)
    plain, towered = twin(
        lambda: mlp(kernel_regularizer="l2", activity_regularizer="l1"),
        4,
        replicate_variables=True,
    )
    compile_both(plain, towered, keras.optimizers.Adam(0.01))
    ha, hb = fit_pair(
        plain, towered, x, y, batch_size=9, epochs=3, validation_data=(xv, yv)
    )
    assert "val_loss" in hb
    assert_same_history(ha, hb)
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)
    assert_close(
        towered.evaluate(xv, yv, batch_size=5, verbose=0),
        plain.evaluate(xv, yv, batch_size=5, verbose=0),
    )
    assert_close(
        towered.predict(xv, batch_size=5, verbose=0),
        plain.predict(xv, batch_size=5, verbose=0),
    )


@pytest.mark.parametrize("towers", [2, 4])
def test_batch_normalization(towers):
    x, y = regression_data(n=29)
    plain, towered = twin(batch_norm_model, towers, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.SGD(0.05))
    ha, hb = fit_pair(plain, towered, x, y, batch_size=10, epochs=2)
    assert_same_history(ha, hb)
    # Moving statistics (non-trainable, updated by tower 0 only) included.
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)


@pytest.mark.parametrize("towers", [2, 4])
def test_embedding_with_adam_sparse_gradients(towers):
    rng = np.random.default_rng(0)
    # Few distinct ids: rows repeat within and across towers, which Adam
    # would get wrong if the sparse rows were not combined as one device.
    x = rng.integers(0, 8, size=(30, 6)).astype("int32")
    y = rng.normal(size=(30, 1)).astype("float32")
    plain, towered = twin(embedding_model, towers, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.Adam(0.05))
    assert_trains_as_one_device(plain, towered, x, y, batch_size=7, epochs=2)


def token_and_position_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    tokens = keras.layers.Embedding(50, 4)(inputs)
    # A second table, gathered at each example's positions 0..5. The indices
    # come from the inputs: on a constant, the layer would run once, when the
    # model is built, and its table would get no gradient.
    index = keras.layers.Lambda(
        lambda t: t * 0 + keras.ops.arange(6, dtype="int32"), output_shape=(6,)
    )
    positions = keras.layers.Embedding(6, 4)(index(inputs))
    hidden = keras.layers.GlobalAveragePooling1D()(tokens + positions)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


@pytest.mark.parametrize(
    "options",
    [{}, {"steps_per_execution": 3}, {"run_eagerly": True}],
    ids=["traced", "spe3", "eager"],
)
def test_sparse_rows_are_gathered_on_every_tower(options, monkeypatch):
    gathered = spy(monkeypatch, ring.Ring, "gather_rows")
    run_keys = spy(monkeypatch, keys, "run_key")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 8, size=(31, 6)).astype("int32")
    y = rng.normal(size=(31, 1)).astype("float32")
    plain, towered = twin(token_and_position_model, 3, replicate_variables=True)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", **options)
    # Batches of 7, 7, 7, 7 and 3 examples, then 2 (fewer than the towers):
    # the gathered rows change shape from step to step, also within one call
    # of `steps_per_execution=3`.
    assert_trains_as_one_device(plain, towered, x, y, batch_size=7, epochs=2)
    assert_trains_as_one_device(plain, towered, x[:2], y[:2], batch_size=2)
    # Every tower received the rows (values and indices) of both tables, in
    # one gather each per traced step (every step, eagerly).
    assert gathered.count >= 2
    # On one worker the gathers keep the trace's instance keys (a key per
    # run grew a process by 2 KB a step: TensorFlow keeps every key).
    assert run_keys.count == 0


def test_errors():
    with pytest.raises(ValueError, match=r"at least 2 towers.*Received: devices="):
        Replicas(["/CPU:0"])


def test_jit_compile_with_replicas_matches_one_device():
    x, y = regression_data(n=23)
    plain, towered = twin(batch_norm_model, 3, replicate_variables=True)
    # SGD: the Dense bias before the normalization has a gradient of 0 up to
    # rounding, whose sign Adam's first steps turn into +-lr (1.4e-5 apart
    # after one step of a 2+2+1 batch, with or without XLA or replicas).
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=True
        )
    assert_trains_as_one_device(plain, towered, x, y, batch_size=5, epochs=2)


def test_pack_and_unpack_are_inverse():
    tensors = [tf.reshape(tf.range(6.0), (2, 3)), tf.constant([7.0]), tf.zeros((0,))]
    flat = pack(tensors)
    assert flat.shape == (7,)
    for before, after in zip(tensors, unpack(flat, [t.shape for t in tensors])):
        np.testing.assert_array_equal(before.numpy(), after.numpy())


def call_sums(gradients, shapes, runs=None, bucket_mb=25):
    flats = []

    def doubled(flat):  # one collective: two towers with the same values
        flats.append(flat)
        return flat * tf.cast(2, flat.dtype)

    options = AllReduceOptions(bucket_mb=bucket_mb)
    summed = ring_gradients.sum_in_call(gradients, shapes, doubled, options, runs)
    return summed, flats


@pytest.mark.parametrize("bucket_mb", [25, 1e-6])
def test_a_call_sums_its_dense_gradients_in_buckets_and_keeps_sparse_ones(bucket_mb):
    shapes = [tf.TensorShape(s) for s in ([2, 3], [4], [2], [5, 2])]
    gradients = [
        tf.reshape(tf.range(6.0), [1, 6]),  # a static shape short of its variable's
        tf.constant([1, 2, 3, 4], tf.int32),
        tf.constant([0.5, -1.0]),
        tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3])),
    ]
    summed, flats = call_sums(gradients, shapes, bucket_mb=bucket_mb)
    np.testing.assert_array_equal(summed[0].numpy(), 2 * np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(summed[1].numpy(), [2, 4, 6, 8])
    np.testing.assert_array_equal(summed[2].numpy(), [1.0, -2.0])
    assert summed[3] is gradients[3]
    # One bucket per dtype, or one per gradient when a bucket holds less.
    sizes = [8, 4] if bucket_mb == 25 else [2, 6, 4]  # the last gradients first
    assert [int(f.shape[0]) for f in flats] == sizes


def test_a_call_that_does_not_run_adds_nothing():
    shapes = [tf.TensorShape([2, 2]), tf.TensorShape([5, 2])]
    dense = tf.constant([[-0.0, 2.0], [float("nan"), -3.0]])
    rows = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([0, 4, 4]), [5, 2])
    (silent, no_rows), flats = call_sums([dense, rows], shapes, tf.constant(False))
    np.testing.assert_array_equal(flats[0].numpy(), np.zeros(4))
    assert not np.signbit(flats[0].numpy()).any()  # +0.0: x + 0.0 == x
    np.testing.assert_array_equal(silent.numpy(), np.zeros((2, 2)))
    assert no_rows.values.shape[0] == 0 and no_rows.indices.shape[0] == 0
    (kept, all_rows), _ = call_sums([dense, rows], shapes, tf.constant(True))
    np.testing.assert_array_equal(kept.numpy(), 2 * dense.numpy())
    np.testing.assert_array_equal(all_rows.indices.numpy(), [0, 4, 4])


def test_a_model_without_trainable_weights_trains_as_one_device():
    # As Keras's own `test_trainer_with_raggeds`: the optimizer clones have
    # no gradient to apply.
    def weightless():
        inputs = keras.Input((5,))
        return keras.Model(inputs, keras.layers.Activation("relu")(inputs))

    x, y = regression_data(n=11, outputs=5)
    plain, towered = twin(weightless, 3, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.Adam(0.01))
    ha, hb = fit_pair(plain, towered, x, y, batch_size=4)
    assert_same_history(ha, hb)
    assert int(towered.optimizer.iterations) == int(plain.optimizer.iterations)


def test_replicas_keep_their_variables_paths_order_values_and_constraints():
    inner = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(
                4, kernel_constraint=keras.constraints.NonNeg(), name="hidden"
            ),
            keras.layers.Dense(2, use_bias=False, name="narrow"),
        ],
        name="inner",
    )
    outer = keras.Sequential(
        [keras.Input((3,)), inner, keras.layers.Dense(1, name="out")], name="outer"
    )
    variables = outer.trainable_variables
    devices = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    replicas = Replicas(devices)
    assert replicas.ensure(variables)
    for tower, device in enumerate(devices[1:], start=1):
        copies = replicas.replica_variables(tower)
        assert [c.path for c in copies] == [v.path for v in variables]
        assert [c.path for c in copies][:3] == [
            "inner/hidden/kernel",
            "inner/hidden/bias",
            "inner/narrow/kernel",
        ]
        assert [c.constraint for c in copies] == [v.constraint for v in variables]
        for copy, variable in zip(copies, variables):
            assert copy is not variable
            assert copy.value.device.endswith(device[len("/device:") :])
            np.testing.assert_array_equal(copy.numpy(), variable.numpy())
        # One TensorFlow name for every replica: TensorFlow makes a kernel
        # for each name of variable a device has not made, most of the time
        # to make one (`replicas._one_tensorflow_name`).
        assert {c.value.name for c in copies} == {"kerastower_replica/variable:0"}


def test_optimizer_clones_keep_their_state_paths_and_the_model_its_names():
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(1)]
    )
    variables = model.trainable_variables
    optimizer = keras.optimizers.Adam(0.01)
    names = [v.value.name for v in variables]
    replicas = Replicas(["/device:CPU:0", "/device:CPU:1"])
    assert replicas.ensure(variables, optimizer)  # builds the optimizer too
    (clone,) = replicas._clones
    assert [s.path for s in clone.variables] == [s.path for s in optimizer.variables]
    assert {s.value.name for s in clone.variables} == {"kerastower_replica/variable:0"}
    # The model's variables and its own optimizer's keep TensorFlow's names.
    assert [v.value.name for v in variables] == names
    assert not any("kerastower_replica" in s.value.name for s in optimizer.variables)
