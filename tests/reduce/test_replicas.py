"""``replicate_variables=True`` trains exactly as one device, replicas in sync."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import (
    assert_close,
    assert_same_history,
    assert_same_weights,
    mlp,
    plain_fit_data,
    regression_data,
    twin,
)

import kerastower
from kerastower.reduce import replica_setting, ring
from kerastower.reduce.replicas import Replicas
from kerastower.reduce.ring import pack, unpack
from kerastower.step import layer_updates


def compile_both(plain, towered, optimizer, loss="mse", metrics=("mae",)):
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.get(keras.optimizers.serialize(optimizer)),
            loss=loss,
            metrics=list(metrics),
        )


def fit_pair(plain, towered, x, y, callbacks=lambda: [], **kwargs):
    kwargs.setdefault("verbose", 0)
    kwargs.setdefault("shuffle", False)
    return [
        model.fit(xs, ys, callbacks=callbacks(), **fit).history
        for model, (xs, ys, fit) in (
            (plain, plain_fit_data(x, y, kwargs)),
            (towered, (x, y, kwargs)),
        )
    ]


def assert_trains_as_one_device(plain, towered, x, y, **kwargs):
    """Fits both; same history and weights, and the replicas in sync."""
    ha, hb = fit_pair(plain, towered, x, y, **kwargs)
    assert_same_history(ha, hb)
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)


def assert_replicas_in_sync(model):
    """Every tower's replica equals the model's variable bit for bit."""
    replicas = model._tower_step.replicas
    assert replicas is not None and replicas.built
    primaries = replicas.replica_variables(0)
    for tower in range(1, model.num_towers):
        copies = replicas.replica_variables(tower)
        assert len(copies) == len(primaries)
        for primary, copy in zip(primaries, copies):
            assert copy.value.device.endswith(model.tower_devices[tower][-5:])
            np.testing.assert_array_equal(copy.numpy(), primary.numpy())
        clone = replicas._clones[tower - 1]
        # Not the learning rate: the clones copy it before each step, so a
        # rate that a callback changed after the last step has not reached
        # them yet.
        assert int(clone.iterations.numpy()) == int(model.optimizer.iterations.numpy())


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


def batch_norm_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(6)(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(hidden))
    return keras.Model(inputs, outputs)


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


def embedding_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(50, 4)(inputs)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


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


def spy(monkeypatch, owner, name):
    """Counts the calls of ``owner.name`` (traces, for a traced step)."""
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        counted.count += 1
        return original(*args, **kwargs)

    counted.count = 0
    monkeypatch.setattr(owner, name, counted)
    return counted


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


@pytest.mark.parametrize("how", ["set_weights", "load_weights"])
def test_weights_changed_between_fits_are_copied_to_the_replicas(how, tmp_path):
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 4, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.Adam(0.01))
    fit_pair(plain, towered, x, y, batch_size=8, epochs=1)
    new = [w + 0.5 for w in mlp(seed=3).get_weights()]
    plain.set_weights(new)
    if how == "set_weights":
        towered.set_weights(new)
    else:
        plain.save_weights(tmp_path / "w.weights.h5")
        towered.load_weights(tmp_path / "w.weights.h5")
    # Copied at once, not only when the next fit begins.
    assert_replicas_in_sync(towered)
    assert_trains_as_one_device(plain, towered, x, y, batch_size=8, epochs=2)


def test_weights_assigned_directly_are_copied_when_fit_begins():
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 2, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.SGD(0.1))
    fit_pair(plain, towered, x, y, batch_size=8, epochs=1)
    for model in (plain, towered):
        model.layers[1].kernel.assign(np.ones((5, 7), "float32"))
    assert_trains_as_one_device(plain, towered, x, y, batch_size=8, epochs=1)


@pytest.mark.parametrize(
    "callback",
    [
        lambda: keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.3),
        lambda: keras.callbacks.ReduceLROnPlateau(
            monitor="loss", factor=0.2, patience=0, min_delta=10.0
        ),
    ],
    ids=["scheduler", "plateau"],
)
def test_learning_rate_changed_by_a_callback_reaches_every_tower(callback):
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 4, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.SGD(0.1))
    ha, hb = fit_pair(
        plain, towered, x, y, callbacks=lambda: [callback()], batch_size=6, epochs=3
    )
    assert_same_history(ha, hb)
    assert ha["learning_rate"][-1] < 0.05  # the callback did change it
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)


def test_default_is_unchanged_and_the_argument_round_trips(tmp_path, monkeypatch):
    monkeypatch.delenv(replica_setting.FORCE_VARIABLE, raising=False)
    x, y = regression_data(n=12)
    assert (
        kerastower.TowerModel.from_model(mlp(), towers=2)._tower_step.replicas is None
    )
    assert (
        kerastower.TowerModel.from_model(
            mlp(), towers=1, replicate_variables=True
        )._tower_step.replicas
        is None
    )
    _, towered = twin(mlp, 2, replicate_variables=True)
    assert towered.get_config()["replicate_variables"] is True
    towered.compile(optimizer="adam", loss="mse")
    towered.fit(x, y, batch_size=4, verbose=0)
    path = tmp_path / "m.keras"
    towered.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.replicate_variables is True
    # Replicas are not weights: the file holds the model's weights only.
    assert len(loaded.get_weights()) == len(towered.get_weights())
    assert_same_weights(loaded, towered)
    # A loaded model's replicas start from the loaded weights and optimizer.
    plain = mlp()
    plain.set_weights(towered.get_weights())
    plain.compile(optimizer="adam", loss="mse")
    plain.optimizer.build(plain.trainable_variables)
    for source, target in zip(towered.optimizer.variables, plain.optimizer.variables):
        target.assign(source)
    ha, hb = fit_pair(plain, loaded, x, y, batch_size=4, epochs=1)
    assert_same_history(ha, hb)
    assert_same_weights(plain, loaded)
    assert_replicas_in_sync(loaded)


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


def test_towers_read_their_replicas_not_the_model_variables():
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 2, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.SGD(0.1))
    fit_pair(plain, towered, x, y, batch_size=8, epochs=1)
    replicas = towered._tower_step.replicas
    copy = replicas.replica_variables(1)[0]
    copy.assign(copy.numpy() + 1.0)
    kernel = towered.layers[1].kernel
    state = layer_updates.StepState([])
    reads = layer_updates.tower_reads(
        towered, towered.trainable_weights, state, replicas, tower=1
    )
    with reads as read:
        assert read == replicas.replica_variables(1)
        inside = keras.ops.convert_to_numpy(kernel.value)
    np.testing.assert_array_equal(inside, copy.numpy())
    np.testing.assert_array_equal(kernel.numpy() + 1.0, copy.numpy())
    # A replica that differs from the model changes tower 1's gradient and
    # predictions (the entry points copy the model to the replicas first;
    # the steps themselves do not).
    predicted = keras.ops.convert_to_numpy(towered.predict_step((x[:8],)))
    expected = plain.predict(x[:8], verbose=0)
    assert_close(predicted[:4], expected[:4])
    assert np.abs(predicted[4:] - expected[4:]).max() > 1e-3
    plain.train_on_batch(x[:8], y[:8])
    towered.train_step((x[:8], y[:8]))
    difference = np.abs(plain.get_weights()[0] - towered.get_weights()[0]).max()
    assert difference > 1e-3


@pytest.mark.parametrize("entry", ["evaluate", "predict", "on_batch", "fit"])
def test_a_weight_assigned_directly_reaches_every_replica(entry):
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 3, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.SGD(0.1))
    fit_pair(plain, towered, x, y, batch_size=8, epochs=1)
    for model in (plain, towered):
        kernel = model.layers[1].kernel
        kernel.assign(kernel.numpy() * 0.5)
    if entry == "evaluate":
        assert_close(
            towered.evaluate(x, y, batch_size=9, verbose=0),
            plain.evaluate(x, y, batch_size=9, verbose=0),
        )
    elif entry == "predict":
        assert_close(
            towered.predict(x, batch_size=9, verbose=0),
            plain.predict(x, batch_size=9, verbose=0),
        )
    elif entry == "on_batch":
        assert_close(towered.predict_on_batch(x[:9]), plain.predict_on_batch(x[:9]))
        assert_close(
            towered.test_on_batch(x[:9], y[:9]), plain.test_on_batch(x[:9], y[:9])
        )
        assert_close(
            towered.train_on_batch(x[:9], y[:9]), plain.train_on_batch(x[:9], y[:9])
        )
        assert_same_weights(plain, towered)
    else:
        assert_trains_as_one_device(plain, towered, x, y, batch_size=9, epochs=1)
    assert_replicas_in_sync(towered)


@pytest.mark.parametrize("towers", [2, 4])
@pytest.mark.parametrize(
    "optimizer",
    [keras.optimizers.SGD(0.05, momentum=0.9), keras.optimizers.Adam(0.01)],
    ids=["sgd", "adam"],
)
@pytest.mark.parametrize("epoch_end", ["apply", "carry"])
def test_gradient_accumulation_matches_one_device_with_the_bigger_batch(
    towers, optimizer, epoch_end
):
    # 23 examples in micro-batches of 3: windows of 9 examples, a short last
    # micro-batch, and a window that either ends with the epoch or spans two.
    x, y = regression_data(n=23)
    plain, towered = twin(mlp, towers, replicate_variables=True)
    compile_both(plain, towered, optimizer)
    accumulation = kerastower.callbacks.GradientAccumulation(3, epoch_end)
    hb = towered.fit(
        x, y, batch_size=3, epochs=2, shuffle=False, verbose=0, callbacks=[accumulation]
    )
    if epoch_end == "apply":
        ha = plain.fit(x, y, batch_size=9, epochs=2, shuffle=False, verbose=0)
        assert_same_history(ha.history, hb.history)
    else:
        # Micro-batches of 3 (the last of each epoch holds 2) over the two
        # epochs as one stream of 46 examples, 3 micro-batches a window.
        xx, yy = np.concatenate([x, x]), np.concatenate([y, y])
        for start, stop in [(0, 9), (9, 18), (18, 26), (26, 35), (35, 44), (44, 46)]:
            plain.train_on_batch(xx[start:stop], yy[start:stop])
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)
    assert accumulation.pending_examples == 0


def test_gradient_accumulation_resumed_inside_a_window(tmp_path):
    """A backup taken inside a window resumes into it on every tower."""
    x, y = regression_data(n=24)

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:  # a window of 3 holds one micro-batch
                raise RuntimeError("stopped")

    def fit(model, *extra):
        backup = kerastower.callbacks.BackupAndRestore(tmp_path, save_freq=1)
        accumulation = kerastower.callbacks.GradientAccumulation(3)
        return model.fit(
            x,
            y,
            batch_size=2,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[accumulation, backup, *extra],
        )

    plain, towered = twin(mlp, 4, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.Adam(0.01))
    ha = plain.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    with pytest.raises(RuntimeError, match="stopped"):
        fit(towered, Stop())
    fit(towered)
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)
    assert len(ha.history["loss"]) == 2


class OwnStep(kerastower.TowerModel):
    def train_step(self, data):
        x, y = data

        def loss_fn(a, b):
            return keras.ops.mean(keras.ops.square(self(a, training=True) - b))

        variables = self.trainable_variables
        grads, loss = self.tower_gradients(loss_fn, variables, x, y)
        self.optimizer.apply_gradients(zip(grads, variables))
        return {"loss": loss}


def own_step_twin(setting, jit_compile=False):
    plain, base = mlp(), mlp()
    towered = OwnStep(base.inputs, base.outputs, towers=3, replicate_variables=setting)
    towered.set_weights(plain.get_weights())
    compile_both(plain, towered, keras.optimizers.Adam(0.01), metrics=())
    if jit_compile:  # XLA per tower
        towered.compile(
            optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=True
        )
    return plain, towered


@pytest.mark.parametrize("setting, jit_compile", [(True, False), ("auto", True)])
def test_a_train_step_of_ones_own_trains_on_replicas(setting, jit_compile, monkeypatch):
    monkeypatch.setenv(replica_setting.FORCE_VARIABLE, "1")  # "auto" on CPUs
    x, y = regression_data(n=23)
    plain, towered = own_step_twin(setting, jit_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_pair(plain, towered, x, y, batch_size=5, epochs=2)
    assert not [w for w in caught if "replicate_variables" in str(w.message)]
    assert_same_weights(plain, towered)
    replicas = towered._tower_step.replicas
    assert replicas.built and not replicas._clones  # the step's own optimizer
    assert towered.jit_compile is jit_compile
    towered.evaluate(x, y, verbose=0)  # copies the last update to the replicas
    for tower in (1, 2):
        for primary, copy in zip(
            towered.trainable_weights, replicas.replica_variables(tower)
        ):
            np.testing.assert_array_equal(copy.numpy(), primary.numpy())


def test_a_train_step_of_ones_own_reads_replicas_that_each_step_refreshes(
    monkeypatch,
):
    x, y = regression_data(n=9)
    plain, towered = own_step_twin(True)
    towered.train_step((x, y))  # makes the replicas
    plain.train_on_batch(x, y)
    replicas = towered._tower_step.replicas

    def spoil_the_replicas():
        for tower in (1, 2):
            for copy in replicas.replica_variables(tower):
                copy.assign(copy.numpy() + 1.0)

    spoil_the_replicas()
    towered.train_step((x, y))
    plain.train_on_batch(x, y)
    assert_same_weights(plain, towered)
    # Without the copy at the start of the step, towers 1 and 2 would read
    # what the replicas hold.
    monkeypatch.setattr(Replicas, "broadcast", lambda self: None)
    spoil_the_replicas()
    towered.train_step((x, y))
    plain.train_on_batch(x, y)
    difference = np.abs(plain.get_weights()[0] - towered.get_weights()[0]).max()
    assert difference > 1e-3


def test_gradient_accumulation_schedule_with_sparse_gradients_and_adam():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 8, size=(30, 6)).astype("int32")
    y = rng.normal(size=(30, 1)).astype("float32")
    plain, towered = twin(embedding_model, 3, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.Adam(0.05), metrics=())
    towered.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[kerastower.callbacks.GradientAccumulation({1: 3})],
    )
    # Micro-batches of 4 (the last of each epoch holds 2): windows of 1 in
    # the first epoch, then of 3.
    windows = [(i, min(i + 4, 30)) for i in range(0, 30, 4)]
    windows += [(0, 12), (12, 24), (24, 30)]
    for start, stop in windows:
        plain.train_on_batch(x[start:stop], y[start:stop])
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)


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
