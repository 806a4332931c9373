"""GradientAccumulation: k micro-batches equal one device with the k-times batch."""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only
from oracle import (
    assert_same_history,
    assert_same_weights,
    fit_accumulated_and_plain,
    mlp,
    regression_data,
    token_position_model,
    twin,
)

import kerastower
from kerastower.callbacks import GradientAccumulation

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam": lambda: keras.optimizers.Adam(0.01),
}


@pytest.mark.parametrize("towers", [1, 2, 3])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("steps, micro", [(3, 4), (4, 2)])
def test_accumulation_matches_one_device_with_the_bigger_batch(
    towers, optimizer, steps, micro
):
    x, y = regression_data(n=23)  # uneven windows: 23 is no multiple of k * b
    plain, towered = twin(mlp, towers)
    plain.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse", metrics=["mae"])
    towered.compile(optimizer=OPTIMIZERS[optimizer](), loss="mse", metrics=["mae"])
    ha, hb = fit_accumulated_and_plain(plain, towered, x, y, steps, micro)
    assert_same_history(ha, hb)
    assert_same_weights(plain, towered)
    assert int(towered.optimizer.iterations) == int(plain.optimizer.iterations)


def test_weights_change_only_after_every_kth_micro_batch():
    x, y = regression_data(n=20)
    model = kerastower.TowerModel.from_model(mlp(), towers=2)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    seen = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((batch, model.get_weights()[0].copy()))

    before = model.get_weights()[0].copy()
    model.fit(
        x,
        y,
        batch_size=2,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[GradientAccumulation(3), Record()],
    )
    assert len(seen) == 10  # callbacks see every micro-batch
    changed = []
    previous = before
    for _, weights in seen:
        changed.append(not np.array_equal(previous, weights))
        previous = weights
    # Updates after micro-batches 3, 6, 9 and the partial window (10) at epoch end.
    assert changed == [False, False, True, False, False, True, False, False, True, True]
    assert int(model.optimizer.iterations) == 4


def test_learning_rate_schedule_and_weight_decay_act_once_per_update():
    x, y = regression_data(n=24)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5)
    plain, towered = twin(mlp, 3)
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.2, clipnorm=0.5),
            loss="mse",
        )
    fit_accumulated_and_plain(plain, towered, x, y, steps=3, batch_size=4)
    assert_same_weights(plain, towered)
    assert int(towered.optimizer.iterations) == 4


def test_epoch_shorter_than_k_still_updates():
    x, y = regression_data(n=6)
    plain, towered = twin(mlp, 2)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # Batches of 8 * 2 = 16 hold all 6 examples: one step an epoch on one device.
    fit_accumulated_and_plain(plain, towered, x, y, steps=8, batch_size=2)
    assert_same_weights(plain, towered)


def test_carry_policy_spans_epochs():
    x, y = regression_data(n=23)
    plain, towered = twin(mlp, 2)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # Micro-batches of 4 (the last of each epoch holds 3), windows of 4.
    towered.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[GradientAccumulation(4, epoch_end="carry")],
    )
    stream_x = np.concatenate([x, x])
    stream_y = np.concatenate([y, y])
    for start, stop in [(0, 16), (16, 31), (31, 46)]:
        plain.train_on_batch(stream_x[start:stop], stream_y[start:stop])
    assert_same_weights(plain, towered)


def test_schedule_changes_steps_by_epoch():
    x, y = regression_data(n=24)
    plain, towered = twin(mlp, 2)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    plain.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    plain.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    towered.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[GradientAccumulation({1: 3})],
    )
    assert_same_weights(plain, towered)


@pytest.mark.parametrize("steps", [0, -3, 1.5, "4", True, {}, {-1: 2}, {0: 0}])
def test_bad_steps_get_a_keras_style_error(steps):
    with pytest.raises(ValueError, match=r"`steps`.*Received: steps="):
        GradientAccumulation(steps)


def test_bad_epoch_end_policy():
    with pytest.raises(ValueError, match=r"Received: epoch_end='drop'"):
        GradientAccumulation(2, epoch_end="drop")


def test_needs_a_tower_model():
    model = mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="needs a kerastower.TowerModel"):
        model.fit(*regression_data(), callbacks=[GradientAccumulation(2)], verbose=0)


class OwnStep(kerastower.TowerModel):
    """The keras.io custom-fit pattern: its own tape and optimizer update."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x, y, self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


class SuperStep(kerastower.TowerModel):
    def train_step(self, data):
        return super().train_step(data)


def test_a_train_step_that_does_not_accumulate_is_refused():
    # Its updates are its own: silently accumulating nothing would be wrong.
    inputs = keras.Input((5,))
    model = OwnStep(inputs, keras.layers.Dense(1)(inputs), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="OwnStep, whose steps accumulated nothing"):
        model.fit(*regression_data(), callbacks=[GradientAccumulation(2)], verbose=0)


def test_a_train_step_that_calls_super_is_accumulated():
    x, y = regression_data()
    plain, towered = twin(mlp, 2)
    model = SuperStep.from_model(towered, towers=2)
    plain.compile(optimizer="sgd", loss="mse")
    model.compile(optimizer="sgd", loss="mse")
    fit_accumulated_and_plain(plain, model, x, y, steps=2, batch_size=4, epochs=1)
    assert_same_weights(plain, model)


class Stop(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        raise KeyboardInterrupt


def test_a_fit_stopped_by_an_error_leaves_no_accumulation_behind():
    # Keras skips on_train_end on errors; the next fit, without the
    # callback, must train as plain Keras does (Ctrl-C in a notebook).
    x, y = regression_data()
    plain, towered = twin(mlp, 2)
    towered.compile(optimizer="sgd", loss="mse")
    with pytest.raises(KeyboardInterrupt):
        towered.fit(
            x, y, batch_size=4, verbose=0, callbacks=[GradientAccumulation(2), Stop()]
        )
    plain.set_weights(towered.get_weights())
    plain.compile(optimizer="sgd", loss="mse")
    for model in (plain, towered):
        model.fit(x, y, batch_size=4, shuffle=False, verbose=0)
    assert_same_weights(plain, towered)


@keras3_only  # Keras 2's optimizers have no `gradient_accumulation_steps`
def test_optimizer_gradient_accumulation_steps_points_to_the_callback():
    model = kerastower.TowerModel.from_model(mlp(), towers=2)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), loss="mse"
    )
    with pytest.raises(ValueError, match="GradientAccumulation"):
        model.fit(*regression_data(), verbose=0)


@pytest.mark.parametrize("towers", [1, 3])
@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
@pytest.mark.parametrize(
    "optimizer",
    [lambda: keras.optimizers.Adam(0.01), lambda: keras.optimizers.Adagrad(0.1)],
    ids=["adam", "adagrad"],
)
def test_sparse_gradients_keep_one_devices_rows(towers, run_eagerly, optimizer):
    # Few token ids, so rows repeat within and across micro-batches: Keras's
    # Adam squares each row of the slices, so a window summed densely (the
    # square of the sum) trained another model (0.04 off after one epoch).
    # The position table is gathered once per batch: its rows sum by index.
    rng = np.random.default_rng(3)
    x = rng.integers(0, 5, size=(22, 6)).astype("int32")
    y = rng.normal(size=(22, 1)).astype("float32")
    plain, towered = twin(token_position_model, towers)
    plain.compile(optimizer=optimizer(), loss="mse")
    towered.compile(optimizer=optimizer(), loss="mse", run_eagerly=run_eagerly)
    ha, hb = fit_accumulated_and_plain(plain, towered, x, y, steps=3, batch_size=3)
    assert_same_history(ha, hb)
    assert_same_weights(plain, towered)


def test_a_window_of_sparse_rows_resumes_after_a_stop(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.integers(0, 5, size=(24, 6)).astype("int32")
    y = rng.normal(size=(24, 1)).astype("float32")

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:  # a window of 3 holds one micro-batch's rows
                raise RuntimeError("stopped")

    def fit(model, *extra):
        return model.fit(
            x,
            y,
            batch_size=2,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[
                GradientAccumulation(3),
                kerastower.callbacks.BackupAndRestore(tmp_path, save_freq=1),
                *extra,
            ],
        )

    plain, towered = twin(token_position_model, 2)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    plain.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    with pytest.raises(RuntimeError, match="stopped"):
        fit(towered, Stop())
    fit(towered)
    assert_same_weights(plain, towered)


@pytest.mark.parametrize(
    "towers, replicate",
    [(1, False), (3, False), pytest.param(3, True, marks=keras3_only)],
    ids=["1", "3", "3r"],
)
def test_sparse_gradients_get_no_dense_copy_of_their_table(towers, replicate):
    # The window's dense sum of an embedding table would be a full copy of
    # the table that its sparse gradients never use.
    rng = np.random.default_rng(5)
    x = rng.integers(0, 5, size=(18, 6)).astype("int32")
    y = rng.normal(size=(18, 1)).astype("float32")
    plain, towered = twin(token_position_model, towers, replicate_variables=replicate)
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    towered.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(towered.gradient_accumulator)
    )
    fit_accumulated_and_plain(
        plain, towered, x, y, steps=2, batch_size=3, callbacks=[record]
    )
    assert_same_weights(plain, towered)
    accumulator = seen[-1]
    windows = [accumulator.window, *accumulator.replica_windows]
    assert len(windows) == (towers if replicate else 1)
    tables = ["embeddings" in v.name for v in towered.trainable_variables]
    assert sum(tables) == 2 and not all(tables)
    for window in windows:
        rows = [total.numpy().shape[0] for total in window.sums]
        for table, variable, n in zip(tables, towered.trainable_variables, rows):
            assert n == (0 if table else variable.shape[0]), variable.path
