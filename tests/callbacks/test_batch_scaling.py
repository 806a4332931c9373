"""`BatchScaling` against the closed-form warmup and scaling formulas.

The probe model has one weight ``w`` (initially 0) on inputs of ones and the
loss ``mean(y_pred)``, so ``d loss / d w = 1`` and plain SGD moves ``w`` by
exactly ``-lr`` per step: the weights show the learning rate the compiled step
really used, not only the value the callback wrote.
"""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_2, keras, keras3_only
from oracle import KERAS_MINOR, assert_close, mlp, plain_fit_data, regression_data

import kerastower
from kerastower import scaling
from kerastower.callbacks import BatchScaling, ScaledSchedule

N = 20
x_ones = np.ones((N, 1), "float32")
y_zeros = np.zeros((N, 1), "float32")


def probe_model(towers=None, learning_rate=1.0, **compile_kwargs):
    inputs = keras.Input((1,))
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")(inputs)
    if towers is None:
        model = keras.Model(inputs, outputs)
    else:
        model = kerastower.TowerModel(inputs, outputs, towers=towers)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate),
        loss=lambda y_true, y_pred: y_pred,
        **compile_kwargs,
    )
    return model


class Recorder(keras.callbacks.Callback):
    """Records the optimizer's rate at each batch start and ``w`` after it."""

    def __init__(self):
        super().__init__()
        self.epoch = 0
        self.lr, self.w, self.applied = {}, {}, {}

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.before = float(self.model.get_weights()[0][0, 0])
        value = self.model.optimizer.learning_rate
        self.lr[self.epoch, batch] = float(tf.convert_to_tensor(value).numpy())

    def on_train_batch_end(self, batch, logs=None):
        after = float(self.model.get_weights()[0][0, 0])
        self.w[self.epoch, batch] = after
        self.applied[self.epoch, batch] = self.before - after


def closed_form(base, target, warmup, epoch, batch, steps):
    """lr = lr_0 + (lr_target - lr_0) * min((k + (j + 1) / S) / E_w, 1)."""
    if warmup == 0:
        return target
    return base + (target - base) * min((epoch + (batch + 1) / steps) / warmup, 1.0)


def fit(model, callbacks, batch_size, epochs, **kwargs):
    return model.fit(
        x_ones,
        y_zeros,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
        **kwargs,
    )


# --- pure math -----------------------------------------------------------


def test_global_batch_size_counts_towers_and_workers():
    assert kerastower.global_batch_size(32, 4) == 128  # all workers' towers
    assert kerastower.global_batch_size(5, mlp()) == 5
    assert kerastower.global_batch_size(5, probe_model(towers=2)) == 10
    # A model on several workers: every worker assumed to have its towers.
    plain = mlp()
    plain.num_towers, plain.num_workers = 3, 2
    assert kerastower.global_batch_size(5, plain) == 30


def test_worker_batch_size_is_what_this_workers_fit_takes():
    # One worker: the global batch. Several: this worker's towers only.
    assert scaling.worker_batch_size(32, 4) == 128
    assert scaling.worker_batch_size(5, mlp()) == 5
    assert scaling.worker_batch_size(5, probe_model(towers=2)) == 10
    plain = mlp()
    plain.num_towers, plain.num_workers = 3, 2
    assert scaling.worker_batch_size(5, plain) == 15
    with pytest.raises(ValueError, match=r"Received: per_tower_batch_size=0"):
        scaling.worker_batch_size(0, 2)
    with pytest.raises(ValueError, match=r"Received: towers_or_model='2'"):
        scaling.worker_batch_size(4, "2")


def test_target_learning_rate_rules():
    assert scaling.target_learning_rate(0.1, 256, 1024) == pytest.approx(0.4, rel=1e-12)
    assert scaling.target_learning_rate(0.1, 256, 1024, "sqrt") == pytest.approx(0.2)
    assert scaling.target_learning_rate(3e-4, 32, 48, "sqrt") == pytest.approx(
        3e-4 * math.sqrt(1.5), rel=1e-12
    )
    assert scaling.target_learning_rate(0.1, 64, 16) == pytest.approx(0.025)


def test_warmup_learning_rate_table():
    steps, warmup = 4, 2
    got = [
        scaling.warmup_learning_rate(k, j, steps, 0.1, 0.5, warmup)
        for k in range(3)
        for j in range(steps)
    ]
    want = [
        0.1 + 0.4 * min((k + (j + 1) / 4) / 2, 1) for k in range(3) for j in range(4)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[7] == pytest.approx(0.5) and got[-1] == 0.5
    assert scaling.warmup_learning_rate(0, 0, None, 0.1, 0.5, 0) == 0.5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"per_tower_batch_size": 0},
            r"`per_tower_batch_size` must be an integer >= 1\. "
            r"Received: per_tower_batch_size=0",
        ),
        ({"per_tower_batch_size": 2.5}, r"Received: per_tower_batch_size=2\.5"),
        ({"per_tower_batch_size": True}, r"Received: per_tower_batch_size=True"),
        (
            {"base_learning_rate": 0.0},
            r"`base_learning_rate` must be a finite number > 0\. "
            r"Received: base_learning_rate=0\.0",
        ),
        ({"base_learning_rate": -0.1}, r"Received: base_learning_rate=-0\.1"),
        ({"base_learning_rate": float("nan")}, r"Received: base_learning_rate=nan"),
        ({"base_learning_rate": "0.1"}, r"Received: base_learning_rate='0\.1'"),
        (
            {"base_batch_size": -4},
            r"`base_batch_size` must be an integer >= 1\. Received: base_batch_size=-4",
        ),
        (
            {"rule": "cubic"},
            r"`rule` must be one of 'linear', 'sqrt'\. Received: rule='cubic'",
        ),
        (
            {"warmup_epochs": -1},
            r"`warmup_epochs` must be a finite number >= 0\. "
            r"Received: warmup_epochs=-1",
        ),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"per_tower_batch_size": 4, "base_learning_rate": 0.1, "base_batch_size": 4}
    with pytest.raises(ValueError, match=match):
        BatchScaling(**{**args, **kwargs})


def test_bad_towers_and_dataset():
    with pytest.raises(ValueError, match=r"Received: towers_or_model=0"):
        kerastower.global_batch_size(4, 0)
    with pytest.raises(ValueError, match=r"integer >= 1 or a model\. Received"):
        kerastower.global_batch_size(4, "2")
    with pytest.raises(ValueError, match=r"tf\.data\.Dataset\. Received: dataset=nd"):
        kerastower.batch_for_towers(x_ones, 2, 2)
    with pytest.raises(ValueError, match=r"Received: per_tower_batch_size=-2"):
        kerastower.batch_for_towers(tf.data.Dataset.range(3), -2, 2)


def test_batch_for_towers():
    dataset = tf.data.Dataset.range(10)
    model = probe_model(towers=2)
    sizes = [len(b) for b in kerastower.batch_for_towers(dataset, 2, model)]
    assert sizes == [4, 4, 2]
    dropped = kerastower.batch_for_towers(dataset, 2, 2, drop_remainder=True)
    assert [b.numpy().tolist() for b in dropped] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_batch_for_towers_batches_this_workers_batch():
    # One of two workers with 3 towers batches 2 x 3 examples, its own part
    # of a global batch (the sum over workers): not 2 x 3 x 2.
    plain = mlp()
    plain.num_towers, plain.num_workers = 3, 2
    batches = kerastower.batch_for_towers(tf.data.Dataset.range(14), 2, plain)
    assert [len(b) for b in batches] == [6, 6, 2]
    assert kerastower.global_batch_size(2, plain) == 12


# --- the callback ----------------------------------------------------------


def test_warmup_rate_at_every_batch_matches_closed_form():
    base, base_batch, per_tower, warmup, epochs = 0.01, 2, 4, 2, 3
    steps = N // per_tower
    target = base * per_tower / base_batch
    model, rec = probe_model(), Recorder()
    cb = BatchScaling(per_tower, base, base_batch, warmup_epochs=warmup)
    history = fit(model, [cb, rec], per_tower, epochs)
    keys = [(k, j) for k in range(epochs) for j in range(steps)]
    want = [closed_form(base, target, warmup, k, j, steps) for k, j in keys]
    if not KERAS_2:  # Keras 2's `learning_rate` is the next step's after a step
        np.testing.assert_allclose([rec.lr[key] for key in keys], want, rtol=1e-6)
    np.testing.assert_allclose([rec.applied[key] for key in keys], want, rtol=1e-5)
    np.testing.assert_allclose(
        [rec.w[key] for key in keys], -np.cumsum(want), rtol=1e-5
    )
    assert want[0] == pytest.approx(base + (target - base) / (warmup * steps))
    assert want[2 * steps - 1] == pytest.approx(target)
    np.testing.assert_allclose(
        history.history["learning_rate"],
        [closed_form(base, target, warmup, k, steps - 1, steps) for k in range(epochs)],
        rtol=1e-6,
    )
    assert cb.global_batch_size == 4 and cb.target_learning_rate == pytest.approx(0.02)


@pytest.mark.parametrize("rule, target", [("linear", 0.04), ("sqrt", 0.02)])
def test_linear_and_sqrt_targets_with_towers(rule, target):
    model, rec = probe_model(towers=2), Recorder()
    cb = BatchScaling(8, 0.01, 4, rule=rule)
    fit(model, [cb, rec], 16, 2)
    assert cb.global_batch_size == 16
    assert cb.target_learning_rate == pytest.approx(target, rel=1e-12)
    np.testing.assert_allclose(list(rec.lr.values()), target, rtol=1e-6)
    np.testing.assert_allclose(list(rec.applied.values()), target, rtol=1e-5)


def test_towers_match_one_device_with_the_same_global_batch():
    x, y = regression_data(n=24)
    plain, towered = mlp(), kerastower.TowerModel.from_model(mlp(), towers=2)
    for model, per_tower in ((plain, 8), (towered, 4)):
        model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
        cb = BatchScaling(per_tower, 0.05, 4, warmup_epochs=1)
        kwargs = dict(batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
        xs, ys, kwargs = (
            plain_fit_data(x, y, kwargs) if model is plain else (x, y, kwargs)
        )
        model.fit(xs, ys, **kwargs)
        assert cb.target_learning_rate == pytest.approx(0.1)
    for u, v in zip(plain.get_weights(), towered.get_weights(), strict=True):
        assert_close(u, v)


def test_schedule_value_is_scaled():
    decay = keras.optimizers.schedules.ExponentialDecay(0.05, 3, 0.5)
    model, rec = probe_model(learning_rate=decay), Recorder()
    base, warmup, epochs, per_tower = 0.2, 1.5, 3, 5
    steps = N // per_tower
    fit(
        model,
        [BatchScaling(per_tower, base, 2, "sqrt", warmup), rec],
        per_tower,
        epochs,
    )
    scale = math.sqrt(per_tower / 2)
    keys = [(k, j) for k in range(epochs) for j in range(steps)]
    want = [
        0.05
        * 0.5 ** ((k * steps + j) / 3)
        * closed_form(1.0, scale, warmup, k, j, steps)
        for k, j in keys
    ]
    np.testing.assert_allclose([rec.applied[key] for key in keys], want, rtol=1e-5)
    if KERAS_2:
        # Keras 2's `learning_rate` under a schedule is the rate the last
        # step applied (`apply_gradients` updates it), not the next one's.
        reported, want = [rec.lr[key] for key in keys[1:]], want[:-1]
    else:
        reported = [rec.lr[key] for key in keys]
    np.testing.assert_allclose(reported, want, rtol=1e-6)

    wrapped = model.optimizer._learning_rate
    assert isinstance(wrapped, ScaledSchedule) and wrapped.schedule is decay
    config = model.optimizer.get_config()
    restored = keras.optimizers.SGD.from_config(config)._learning_rate
    assert isinstance(restored, ScaledSchedule)
    assert float(restored.factor.numpy()) == pytest.approx(scale)
    assert restored.schedule.get_config() == decay.get_config()

    # A second `fit` reuses the wrapper instead of wrapping it again.
    rec2 = Recorder()
    fit(model, [BatchScaling(per_tower, base, 2), rec2], per_tower, 1)
    assert model.optimizer._learning_rate is wrapped
    step = epochs * steps
    expected = 0.05 * 0.5 ** (step / 3) * per_tower / 2
    assert rec2.applied[0, 0] == pytest.approx(expected, rel=1e-5)
    if not KERAS_2:  # Keras 2 reports the first fit's last rate here
        assert rec2.lr[0, 0] == pytest.approx(expected, rel=1e-6)


def test_resume_from_initial_epoch_gives_the_same_rates():
    args = (4, 0.01, 2, "linear", 2.5)
    full, partial = Recorder(), Recorder()
    fit(probe_model(), [BatchScaling(*args), full], 4, 4)
    fit(probe_model(), [BatchScaling(*args), partial], 4, 4, initial_epoch=2)
    assert sorted(partial.lr) == [key for key in sorted(full.lr) if key[0] >= 2]
    for key, value in partial.lr.items():
        assert value == full.lr[key]


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("interrupted")


def test_resume_with_backup_and_restore(tmp_path):
    args = (4, 0.01, 2, "linear", 3)
    full = probe_model()
    fit(full, [BatchScaling(*args)], 4, 4)

    first = probe_model()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(first, [BatchScaling(*args), backup, _Interrupt()], 4, 4)
    resumed, rec = probe_model(), Recorder()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    fit(resumed, [BatchScaling(*args), backup, rec], 4, 4)
    assert min(rec.lr) == (2, 0)
    np.testing.assert_allclose(
        resumed.get_weights()[0], full.get_weights()[0], rtol=1e-6
    )


def test_learning_rate_in_csv_logger(tmp_path):
    path = tmp_path / "log.csv"
    logger = keras.callbacks.CSVLogger(str(path))
    fit(probe_model(), [BatchScaling(4, 0.01, 4, warmup_epochs=2), logger], 4, 2)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    np.testing.assert_allclose(
        [float(r["learning_rate"]) for r in rows], [0.01, 0.01], rtol=1e-6
    )
    path2 = tmp_path / "log2.csv"
    logger = keras.callbacks.CSVLogger(str(path2))
    fit(probe_model(), [BatchScaling(4, 0.01, 2, warmup_epochs=2), logger], 4, 2)
    with open(path2) as f:
        rows = list(csv.DictReader(f))
    np.testing.assert_allclose(
        [float(r["learning_rate"]) for r in rows], [0.015, 0.02], rtol=1e-6
    )


def test_wrong_batch_size_is_reported():
    with pytest.raises(
        ValueError,
        match=r"expects global batches of 6 examples \(per_tower_batch_size=3 x "
        r"2 towers x 1 workers\), but the first batch had 3 examples.*"
        r"Received: batch_size=3; expected global_batch_size=6",
    ):
        fit(probe_model(towers=2), [BatchScaling(3, 0.1, 6)], 3, 1)
    with pytest.raises(ValueError, match=r"global batches of 4 .* first batch had 5"):
        fit(probe_model(), [BatchScaling(4, 0.1, 4)], 5, 1)


def test_batch_size_check_with_steps_per_execution():
    # 10 examples in batches of 4, 4, 2: one execution covers the whole epoch.
    model = probe_model(steps_per_execution=4)
    if not KERAS_2 and KERAS_MINOR < (3, 11):  # told only an execution's start
        with pytest.raises(ValueError, match=r"Keras 3.11 and newer do"):
            fit(model, [BatchScaling(4, 0.1, 4)], 4, 1)
        return
    model.fit(
        x_ones[:10],
        y_zeros[:10],
        batch_size=4,
        verbose=0,
        callbacks=[BatchScaling(4, 0.1, 4)],
    )
    model = probe_model(steps_per_execution=2)
    with pytest.raises(ValueError, match=r"first 2 batches had 10 examples in all"):
        fit(model, [BatchScaling(4, 0.1, 4)], 5, 1)


def test_warmup_needs_known_steps():
    dataset = tf.data.Dataset.from_tensor_slices((x_ones, y_zeros))
    dataset = kerastower.batch_for_towers(dataset.filter(lambda a, b: True), 4, 1)
    model = probe_model()
    warmup = BatchScaling(4, 0.1, 4, warmup_epochs=1)
    with pytest.raises(ValueError, match=r"pass `steps_per_epoch` to `fit`"):
        model.fit(dataset, epochs=1, verbose=0, callbacks=[warmup])
    history = model.fit(dataset, verbose=0, callbacks=[BatchScaling(4, 0.1, 2)])
    assert history.history["learning_rate"] == [pytest.approx(0.2)]
    model.fit(dataset, steps_per_epoch=5, verbose=0, callbacks=[warmup])


@keras3_only  # Keras 2 calls the callable once, for a variable's initial value
def test_callable_learning_rate_is_rejected():
    model = probe_model(learning_rate=lambda: 0.1)
    with pytest.raises(ValueError, match=r"float learning rate or a keras"):
        fit(model, [BatchScaling(4, 0.1, 4)], 4, 1)


def test_schedule_wrapped_after_an_earlier_fit():
    # The first `fit` traces a step that calls the bare schedule.
    decay = keras.optimizers.schedules.ExponentialDecay(0.05, 3, 0.5)
    model = probe_model(learning_rate=decay)
    fit(model, [], 4, 1)
    rec = Recorder()
    fit(model, [BatchScaling(4, 0.1, 1), rec], 4, 1)
    want = [0.05 * 0.5 ** ((5 + j) / 3) * 4 for j in range(5)]
    np.testing.assert_allclose(list(rec.applied.values()), want, rtol=1e-5)


SCALED = Path(__file__).resolve().parents[1] / "workers" / "scaled.py"


@pytest.mark.slow
def test_mixed_towers_over_two_workers_scale_with_the_true_global_batch(tmp_path):
    # `kerastower launch -n 2 --towers 2,3`: 2 examples a tower make batches
    # of 4 and 6, a global batch of 10 (not 2 x 2 x 2 or 2 x 3 x 2).
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERASTOWER_")}
    env.pop("TF_CONFIG", None)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", KERASTOWER_REPLICATE_VARIABLES="0")
    command = [sys.executable, "-m", "kerastower", "launch", "-n", "2"]
    command += ["--towers", "2,3", str(SCALED), str(tmp_path)]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"scaled{i}.json").read_text()) for i in (0, 1)]
    steps = 3
    target = 0.01 * 10 / 2  # lr_0 * B / B_0 = 0.05
    want = [
        closed_form(0.01, target, 2, k, j, steps)
        for k in range(2)
        for j in range(steps)
    ]
    for report, towers in zip(reports, (2, 3), strict=True):
        assert (report["towers"], report["workers"]) == (towers, 2)
        assert report["sizes"] == [2 * towers] * steps  # batch_for_towers
        assert report["worker_batch_size"] == 2 * towers
        assert report["global_batch_size"] == 10
        assert report["target_learning_rate"] == pytest.approx(target)
        # The rates the steps applied, and those logged after each epoch.
        np.testing.assert_allclose(report["applied"], want, rtol=1e-5)
        np.testing.assert_allclose(
            report["learning_rate"], [want[steps - 1], want[-1]], rtol=1e-6
        )
        assert report["w"] == pytest.approx(-sum(want), rel=1e-5)
        # The global batch passed to every worker's `fit` is refused, with
        # the batch this worker should pass.
        assert report["error"] == (
            "`BatchScaling` expects global batches of 10 examples "
            "(per_tower_batch_size=2 x 5 towers over 2 workers), but the first "
            "batch had 20 examples over all workers. Pass "
            f"`batch_size={2 * towers}` to `fit` on this worker "
            f"(per_tower_batch_size=2 x its {towers} towers; every worker passes "
            "its own towers' batch), or batch each worker's dataset with "
            "`kerastower.batch_for_towers`. Received: global batch of 20; "
            "expected global_batch_size=10"
        )
