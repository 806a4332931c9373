"""Replicas under gradient accumulation and under a `train_step` of one's own."""

import warnings

import keras
import numpy as np
import pytest
from oracle import (
    assert_same_history,
    assert_same_weights,
    mlp,
    regression_data,
    twin,
)
from replica_checks import (
    assert_replicas_in_sync,
    compile_both,
    embedding_model,
    fit_pair,
)

import kerastower
from kerastower.reduce import replica_setting
from kerastower.reduce.replicas import Replicas


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
