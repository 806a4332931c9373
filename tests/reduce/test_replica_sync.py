"""Replicas follow the model's weights: between fits, assigned directly, read."""

import keras
import numpy as np
import pytest
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
    compile_both,
    fit_pair,
)

import kerastower
from kerastower.reduce import replica_setting
from kerastower.step import layer_updates


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


class _Copies(keras.callbacks.Callback):
    """Counts the weight copies to the replicas, epoch by epoch."""

    def __init__(self, replicas):
        super().__init__()
        self.copies = []
        copy_weights = replicas.copy_weights

        def counted(variables):
            self.copies[-1] += 1
            copy_weights(variables)

        replicas.copy_weights = counted

    def on_train_begin(self, logs=None):
        self.copies.append(0)

    def on_epoch_end(self, epoch, logs=None):
        self.copies.append(0)


class _ShiftEachEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        bias = self.model.layers[1].bias
        bias.assign(bias + 0.25)


class _ShiftingCheckpoint(keras.callbacks.ModelCheckpoint):
    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        bias = self.model.layers[1].bias
        bias.assign(bias + 0.25)


def _epoch_callbacks(kind, tmp_path):
    path = str(tmp_path / "m.keras")
    if kind == "shifts":
        return [_ShiftEachEpoch()]
    if kind == "checkpoints":  # hooks an epoch's beginning, assigns nothing
        return [keras.callbacks.ModelCheckpoint(path)]
    if kind == "shifting_checkpoints":  # a subclass of one that only reads
        return [_ShiftingCheckpoint(path)]
    return []


@pytest.mark.parametrize(
    ("kind", "first"),
    [("none", 0), ("shifts", 1), ("checkpoints", 0), ("shifting_checkpoints", 1)],
)
def test_the_first_epoch_copies_the_weights_only_for_a_callback_that_may_assign(
    kind, first, tmp_path
):
    # The sync as fit begins copies them: the first epoch copies them again
    # only when a callback may assign them as it begins; later epochs always
    # (an epoch's end may have assigned them).
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 3, replicate_variables=True)
    compile_both(plain, towered, keras.optimizers.SGD(0.1))
    copies = _Copies(towered._tower_step.replicas)
    for model, extra in ((plain, []), (towered, [copies])):
        model.fit(
            x,
            y,
            batch_size=8,
            epochs=3,
            shuffle=False,
            verbose=0,
            callbacks=[*_epoch_callbacks(kind, tmp_path), *extra],
        )
    assert copies.copies[:3] == [first, 1, 1]
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)
