"""`ChiefCheckpoint`: stock `ModelCheckpoint` options, chief-only atomic writes, resume.

The reference answers are the stock `keras.callbacks.ModelCheckpoint` (which
files, with which weights) and a run that was never interrupted.
"""

import errno
import json
import os

import numpy as np
import pytest
from keras_family import KERAS_MINOR, keras, keras3_only
from oracle import Crash, assert_same_weights, mlp, regression_data

import kerastower
from kerastower.callbacks import (
    ChiefCheckpoint,
    checkpoint_epoch,
    latest_checkpoint,
)
from kerastower.callbacks.chief_checkpoint import TEMP_PREFIX

X, Y = regression_data(n=24)
X_VAL, Y_VAL = regression_data(n=8, seed=1)
FIT = dict(batch_size=8, shuffle=False, verbose=0)  # global batch: 4 per tower
EPOCHS = 4


def tower_model(seed=0, lr=0.05):
    model = kerastower.TowerModel.from_model(mlp(seed=seed), towers=2)
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="mse", metrics=["mae"])
    return model


def loaded(path, seed):
    """A model with other initial weights that loads checkpoint `path`."""
    model = tower_model(seed=seed)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(str(path))
    return model


def files(directory):
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


# -- Every ModelCheckpoint option gives the stock callback's files and weights.

OPTIONS = [
    ("{epoch:02d}-{loss:.4f}.keras", {}),
    ("{epoch:02d}.weights.h5", {"save_weights_only": True}),
    (
        "best-{epoch}-{val_mae:.3f}.weights.h5",
        {"save_weights_only": True, "save_best_only": True, "monitor": "val_mae"},
    ),
    (
        "best.keras",
        {
            "save_best_only": True,
            "monitor": "loss",
            "mode": "max",
            "initial_value_threshold": 0.5,
        },
    ),
    ("e{epoch}-b{batch}.weights.h5", {"save_weights_only": True, "save_freq": 2}),
]


@pytest.mark.parametrize("pattern, options", OPTIONS)
def test_options_write_what_model_checkpoint_writes(tmp_path, pattern, options):
    write_what_model_checkpoint_writes(tmp_path, pattern, options)


@keras3_only
@pytest.mark.parametrize("pattern, options", OPTIONS[2:4])
def test_the_keras_3_9_save_best_only_decision_writes_what_keras_writes(
    tmp_path, monkeypatch, pattern, options
):
    # Keras 3.8 and 3.9 have no `_should_save_model`; the fallback decides as
    # they do, which for a monitor that is logged is what newer Keras decides.
    from kerastower._keras_compat.keras3 import callbacks as compat_callbacks

    monkeypatch.setattr(compat_callbacks, "_HAS_SHOULD_SAVE", False)
    monkeypatch.setattr(
        ChiefCheckpoint,
        "_should_save_model",
        lambda *args: pytest.fail("the Keras 3.10 hook was called"),
        raising=False,  # Keras 3.8 and 3.9 have none
    )
    write_what_model_checkpoint_writes(tmp_path, pattern, options)


@keras3_only
def test_a_missing_monitor_skips_the_save_as_keras_3_9_does(tmp_path, monkeypatch):
    from kerastower._keras_compat.keras3 import callbacks as compat_callbacks

    monkeypatch.setattr(compat_callbacks, "_HAS_SHOULD_SAVE", False)
    path = tmp_path / "best.keras"
    with pytest.warns(UserWarning, match="only with val_loss available, skipping"):
        tower_model().fit(
            X,
            Y,
            epochs=1,
            callbacks=[ChiefCheckpoint(str(path), save_best_only=True)],
            **FIT,
        )
    assert files(tmp_path) == []


def write_what_model_checkpoint_writes(tmp_path, pattern, options):
    ours, stock = tmp_path / "ours", tmp_path / "stock"
    model = tower_model()
    model.fit(
        X,
        Y,
        epochs=3,
        validation_data=(X_VAL, Y_VAL),
        callbacks=[
            keras.callbacks.ModelCheckpoint(str(stock / pattern), **options),
            ChiefCheckpoint(str(ours / pattern), **options),
        ],
        **FIT,
    )
    assert files(ours) == files(stock)
    assert files(ours)  # every option above saves at least once
    for name in files(ours):
        a, b = loaded(ours / name, seed=1), loaded(stock / name, seed=2)
        assert_same_weights(a, b, rtol=0, atol=0)
        for u, v in zip(a.optimizer.variables, b.optimizer.variables, strict=True):
            np.testing.assert_array_equal(u.numpy(), v.numpy())


def test_full_model_checkpoint_loads_as_a_tower_model(tmp_path):
    model = tower_model()
    model.fit(X, Y, epochs=1, callbacks=[ChiefCheckpoint(tmp_path / "m.keras")], **FIT)
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, kerastower.TowerModel)
    assert_same_weights(loaded, model, rtol=0, atol=0)


@keras3_only  # Keras 2's ModelCheckpoint takes any path (a SavedModel)
@pytest.mark.parametrize(
    "filepath, options",
    [
        ("ckpt.keras", {"save_weights_only": True}),
        ("ckpt.weights", {"save_weights_only": True}),
        ("ckpt.txt", {}),
        ("ckpt", {}),
    ],
)
def test_bad_filepath_is_named(filepath, options):
    with pytest.raises(ValueError, match=f"Received: filepath={filepath}$"):
        ChiefCheckpoint(filepath, **options)


@pytest.mark.parametrize(
    "filepath, options, match",
    [
        ("{epoch}-{batch}.keras", {"save_freq": 3}, "needs `save_freq='epoch'`"),
        ("{epoch}.h5", {}, "`.keras` or `.weights.h5` filepath"),
        ("last.keras", {}, "needs an `{epoch}` field"),
        ("{loss:.2f}.keras", {}, "needs an `{epoch}` field"),
        ("run-{epoch}/model.keras", {}, "in the file name, not in the directory"),
        ("{epoch.keras", {}, "not a valid format string"),
    ],
)
def test_resume_requirements(filepath, options, match):
    with pytest.raises(ValueError, match=match):
        ChiefCheckpoint(filepath, resume=True, **options)


def test_resume_must_be_a_bool():
    with pytest.raises(ValueError, match="`resume` must be a bool. Received: resume=1"):
        ChiefCheckpoint("{epoch}.keras", resume=1)


def test_bad_save_freq():
    with pytest.raises(ValueError, match="save_freq"):
        ChiefCheckpoint("m.keras", save_freq="batch")


# -- Only the chief writes; every worker takes part in every save.


def _spy_saves(model, monkeypatch):
    saved = []
    real_save = model.save

    def save(path, *args, **kwargs):
        saved.append(str(path))
        real_save(path, *args, **kwargs)
        assert os.path.getsize(path) > 0

    monkeypatch.setattr(model, "save", save)
    return saved


def test_non_chief_takes_part_but_writes_nothing(tmp_path, monkeypatch):
    worker_temp = tmp_path / "worker_tmp"
    worker_temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(worker_temp))
    # Built first: with TF_CONFIG naming two workers, TowerModel would start a
    # real MultiWorkerMirroredStrategy. The callback reads TF_CONFIG itself.
    model = tower_model()
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["localhost:1", "localhost:2"]},
                "task": {"type": "worker", "index": 1},
            }
        ),
    )
    saved = _spy_saves(model, monkeypatch)
    ckpt_dir = tmp_path / "ckpt"
    model.fit(
        X, Y, epochs=2, callbacks=[ChiefCheckpoint(ckpt_dir / "{epoch}.keras")], **FIT
    )
    assert len(saved) == 2
    for path in saved:
        assert path.startswith(str(worker_temp / "kerastower-worker1-"))
    assert not ckpt_dir.exists()
    assert files(worker_temp) == []


@pytest.mark.parametrize(
    "task",
    [{"type": "chief", "index": 0}, {"type": "worker", "index": 0}],
    ids=["chief-task", "worker-0-without-chief"],
)
def test_chief_writes_the_real_path(tmp_path, monkeypatch, task):
    spec = {"worker": ["localhost:1", "localhost:2"]}
    if task["type"] == "chief":
        spec["chief"] = ["localhost:0"]
    model = tower_model()  # before TF_CONFIG, as above
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": spec, "task": task}))
    ckpt_dir = tmp_path / "ckpt"
    model.fit(
        X, Y, epochs=2, callbacks=[ChiefCheckpoint(ckpt_dir / "{epoch}.keras")], **FIT
    )
    assert files(ckpt_dir) == ["1.keras", "2.keras"]
    monkeypatch.delenv("TF_CONFIG")
    assert_same_weights(loaded(ckpt_dir / "2.keras", seed=3), model, rtol=0, atol=0)


# -- Atomic writes and errors.


@pytest.mark.parametrize(
    "error, raised, match",
    [
        (RuntimeError("simulated crash"), RuntimeError, "simulated crash"),
        (
            OSError(errno.ENOSPC, "No space left on device"),
            OSError,
            "could not write the checkpoint '.*model.keras'.*No space left",
        ),
    ],
    ids=["crash", "disk-full"],
)
def test_failed_write_leaves_previous_checkpoint_intact(
    tmp_path, monkeypatch, error, raised, match
):
    path = tmp_path / "model.keras"
    model = tower_model()
    checkpoint = ChiefCheckpoint(path)
    model.fit(X, Y, epochs=1, callbacks=[checkpoint], **FIT)
    before = path.read_bytes()
    written = []

    def partial_save(filepath, *args, **kwargs):
        written.append(str(filepath))
        with open(filepath, "wb") as f:
            f.write(before[: len(before) // 2])
        raise error

    monkeypatch.setattr(model, "save", partial_save)
    with pytest.raises(raised, match=match):
        model.fit(X, Y, epochs=1, callbacks=[checkpoint], **FIT)
    assert written and os.path.basename(written[0]).startswith(TEMP_PREFIX)
    assert path.read_bytes() == before
    assert files(tmp_path) == ["model.keras"]


def test_stale_temp_files_are_removed_and_never_resumed(tmp_path):
    stale = tmp_path / f"{TEMP_PREFIX}0123456789ab-9.keras"
    stale.write_bytes(b"half a zip")
    assert latest_checkpoint(str(tmp_path / "{epoch}.keras")) is None
    model = tower_model()
    model.fit(
        X, Y, epochs=1, callbacks=[ChiefCheckpoint(tmp_path / "{epoch}.keras")], **FIT
    )
    assert files(tmp_path) == ["1.keras"]


def test_unwritable_directory_fails_at_train_begin(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    model = tower_model()
    with pytest.raises(OSError, match="cannot write to the checkpoint directory"):
        model.fit(
            X, Y, epochs=1, callbacks=[ChiefCheckpoint(blocker / "m.keras")], **FIT
        )
    assert model.optimizer.iterations.numpy() == 0  # no step was taken


def test_existing_directory_at_the_path_is_an_error(tmp_path):
    (tmp_path / "m.keras").mkdir()
    model = tower_model()
    with pytest.raises(IsADirectoryError, match="non-directory filepath"):
        model.fit(
            X, Y, epochs=1, callbacks=[ChiefCheckpoint(tmp_path / "m.keras")], **FIT
        )


# -- Finding the latest checkpoint.


def test_latest_checkpoint_orders_by_epoch_then_batch(tmp_path):
    pattern = str(tmp_path / "e{epoch}-b{batch:03d}-{loss:.2f}.keras")
    names = ["e9-b010-0.10.keras", "e10-b002-0.90.keras", "e10-b001-0.05.keras"]
    for name in names:  # written in this order: the latest by time is e10-b001
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "other.keras").write_bytes(b"")
    (tmp_path / "e11-b001-0.10.weights.h5").write_bytes(b"")
    assert latest_checkpoint(pattern) == str(tmp_path / "e10-b002-0.90.keras")
    assert checkpoint_epoch(str(tmp_path / "e10-b002-0.90.keras"), pattern) == 10
    assert checkpoint_epoch(str(tmp_path / "other.keras"), pattern) is None


def test_latest_checkpoint_without_counters(tmp_path):
    assert latest_checkpoint(str(tmp_path / "missing" / "{epoch}.keras")) is None
    assert latest_checkpoint(str(tmp_path / "last.keras")) is None
    (tmp_path / "last.keras").write_bytes(b"")
    assert latest_checkpoint(str(tmp_path / "last.keras")) == str(
        tmp_path / "last.keras"
    )
    assert checkpoint_epoch(str(tmp_path / "last.keras"), "last.keras") is None


# -- Resume: an interrupted run ends where an uninterrupted one does.


@pytest.fixture(scope="module")
def uninterrupted():
    model = tower_model()
    history = model.fit(X, Y, epochs=EPOCHS, **FIT)
    return model, history.history


# Keras 2.12 writes `.keras` files as HDF5, without the optimizer state that
# `load_weights` would restore.
HDF5_KERAS_FILES = KERAS_MINOR < (2, 13)


def test_resuming_from_hdf5_keras_files_is_an_error(tmp_path):
    if not HDF5_KERAS_FILES:
        ChiefCheckpoint(tmp_path / "{epoch:02d}.keras", resume=True)
        return
    with pytest.raises(ValueError, match="writes `.keras` files as HDF5"):
        ChiefCheckpoint(tmp_path / "{epoch:02d}.keras", resume=True)


RESUMES = {
    "chief-keras": lambda d: [ChiefCheckpoint(d / "{epoch:02d}.keras", resume=True)],
    "chief-weights": lambda d: [
        ChiefCheckpoint(
            d / "{epoch:02d}-{loss:.3f}.weights.h5", save_weights_only=True, resume=True
        )
    ],
    "backup-and-restore": lambda d: [keras.callbacks.BackupAndRestore(str(d))],
}


@pytest.mark.parametrize("kind", sorted(RESUMES))
def test_resume_matches_an_uninterrupted_run(tmp_path, uninterrupted, kind):
    if kind == "chief-keras" and HDF5_KERAS_FILES:
        pytest.skip(
            "Keras 2.12 has no .keras format (it writes HDF5: an error, tested above)"
        )
    reference, reference_history = uninterrupted
    crashed = tower_model()
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit(
            X, Y, epochs=EPOCHS, callbacks=[*RESUMES[kind](tmp_path), Crash(2)], **FIT
        )
    # A new process: another model object, other initial weights.
    resumed = tower_model(seed=7)
    history = resumed.fit(X, Y, epochs=EPOCHS, callbacks=RESUMES[kind](tmp_path), **FIT)
    assert history.epoch == [2, 3]
    np.testing.assert_allclose(
        history.history["loss"], reference_history["loss"][2:], rtol=1e-6
    )
    assert resumed.optimizer.iterations.numpy() == EPOCHS * 3
    assert_same_weights(resumed, reference, rtol=1e-6, atol=1e-7)


def test_manual_resume_with_load_model(tmp_path, uninterrupted):
    reference, _ = uninterrupted
    pattern = str(tmp_path / "{epoch:02d}.keras")
    model = tower_model()
    model.fit(X, Y, epochs=2, callbacks=[ChiefCheckpoint(pattern)], **FIT)
    path = latest_checkpoint(pattern)
    assert path == str(tmp_path / "02.keras")
    model = keras.models.load_model(path)
    initial_epoch = checkpoint_epoch(path, pattern)
    assert initial_epoch == 2
    model.fit(X, Y, epochs=EPOCHS, initial_epoch=initial_epoch, **FIT)
    assert_same_weights(model, reference, rtol=1e-6, atol=1e-7)


def test_resume_without_checkpoint_trains_from_the_start(tmp_path, uninterrupted):
    reference, _ = uninterrupted
    model = tower_model()
    if HDF5_KERAS_FILES:
        name, options = "{epoch}.weights.h5", {"save_weights_only": True}
    else:
        name, options = "{epoch}.keras", {}
    checkpoint = ChiefCheckpoint(tmp_path / name, resume=True, **options)
    history = model.fit(X, Y, epochs=EPOCHS, callbacks=[checkpoint], **FIT)
    assert history.epoch == list(range(EPOCHS))
    assert_same_weights(model, reference, rtol=1e-6, atol=1e-7)
    # A finished run resumes at its end, and the next plain `fit` is unaffected.
    history = model.fit(X, Y, epochs=EPOCHS, callbacks=[checkpoint], **FIT)
    assert history.epoch == []
    assert model.fit(X, Y, epochs=1, **FIT).epoch == [0]
