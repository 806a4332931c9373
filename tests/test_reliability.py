"""Reliability: full or unwritable disks, non-finite losses, a killed chief.

The reference answers are a one-device `keras.Model` with the same initial
weights and a run that was never interrupted. Disks are made to fail from
Python: `FullDisk` is a real file that raises ``ENOSPC`` once it holds
`FullDisk.limit` bytes, keeping the part that fitted, as a full disk does.
(Running as root, permissions cannot make a directory unwritable, and a tiny
tmpfs needs privileges.)

Crash recovery under SIGKILL is in `test_crash_recovery.py`; `TF_CONFIG`
errors are in `test_bad_inputs.py`; a non-chief worker that dies while the
chief waits for it is in `test_multi_worker.py`.
"""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.saving import saving_lib
from oracle import (
    Crash,
    assert_close,
    assert_same_weights,
    mlp,
    regression_data,
    twin,
)

from kerastower.callbacks import ChiefCheckpoint, GradientAccumulation

X, Y = regression_data(n=16)
FIT = dict(batch_size=4, shuffle=False, verbose=0)  # global batch: 2 per tower
STEPS = 4  # per epoch


def compiled_twin():
    """A one-device model and a two-tower model with the same initial weights."""
    plain, towered = twin(mlp, 2)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return plain, towered


def names(directory):
    return sorted(os.listdir(directory))


# -- Full and unwritable disks.


class FullDisk(io.FileIO):
    """A file on a disk with room for `limit` bytes: writes past it fail."""

    limit = 2000

    def write(self, data):
        data = bytes(data)
        room = max(self.limit - self.tell(), 0)
        if len(data) > room:
            super().write(data[:room])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        return super().write(data)


class Disk:
    """Fills the disk for Keras's `.keras` and `.weights.h5` writers, and frees it.

    A `.keras` archive is streamed into a `FullDisk` file. HDF5 cannot take
    an error from a Python file object safely, so a `.weights.h5` file is
    truncated when opened (as HDF5's ``"w"`` mode does), built in memory,
    and written out through a `FullDisk` file when Keras closes it.
    """

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch
        self.failed_writes = 0

    def _full(self, path):
        file = FullDisk(path, "w")
        self.failed_writes += 1
        return file

    def fill(self):
        store = saving_lib.H5IOStore
        real_h5_file = getattr(store, "_get_h5_file", None)
        real_init, real_close = store.__init__, store.close

        def keras_open(path, mode="r", *args, **kwargs):
            if "w" not in mode:
                return open(path, mode, *args, **kwargs)
            return self._full(path)

        def h5_file(store, path_or_io, mode=None):
            if (mode or store.mode) != "w" or store.archive:
                # Keras 3.10 to 3.13 take no `mode`.
                extra = () if mode is None else (mode,)
                return real_h5_file(store, path_or_io, *extra)
            open(path_or_io, "wb").close()
            store.io_file, store.full_disk_path = io.BytesIO(), path_or_io
            return h5py.File(store.io_file, mode="w")

        def close(store):
            path = getattr(store, "full_disk_path", None)
            if path is None:
                return real_close(store)
            store.h5_file.close()
            try:
                with self._full(path) as file:
                    file.write(store.io_file.getvalue())
            finally:
                store.io_file.close()

        def init(store, root_path, archive=None, mode="r"):
            if mode != "w" or archive:
                return real_init(store, root_path, archive, mode)
            store.root_path, store.archive, store.mode = root_path, None, mode
            open(root_path, "wb").close()
            store.io_file, store.full_disk_path = io.BytesIO(), root_path
            store.h5_file = h5py.File(store.io_file, mode="w")

        self.monkeypatch.setattr(saving_lib, "open", keras_open, raising=False)
        if real_h5_file is None:  # Keras 3.8 and 3.9 open the file in `__init__`
            self.monkeypatch.setattr(store, "__init__", init)
        else:
            self.monkeypatch.setattr(store, "_get_h5_file", h5_file)
        self.monkeypatch.setattr(store, "close", close)

    def free(self):
        self.monkeypatch.undo()


@pytest.fixture
def disk(monkeypatch):
    disk = Disk(monkeypatch)
    yield disk
    disk.free()


def test_chief_checkpoint_on_a_full_disk_loses_nothing(tmp_path, disk):
    plain, model = compiled_twin()
    checkpoint = ChiefCheckpoint(tmp_path / "{epoch}.keras")
    model.fit(X, Y, epochs=1, callbacks=[checkpoint], **FIT)
    first = (tmp_path / "1.keras").read_bytes()
    disk.fill()
    with pytest.raises(
        OSError,
        match=r"could not write the checkpoint '.*2\.keras'.*No space left on device",
    ):
        model.fit(X, Y, epochs=2, initial_epoch=1, callbacks=[checkpoint], **FIT)
    disk.free()
    assert disk.failed_writes == 1  # Keras's own writer hit the full disk
    # The previous checkpoint is untouched; nothing partial is visible.
    assert names(tmp_path) == ["1.keras"]
    assert (tmp_path / "1.keras").read_bytes() == first
    # The state in memory is the one-device state after both epochs ...
    plain.fit(X, Y, epochs=2, **FIT)
    assert_same_weights(model, plain)
    assert int(model.optimizer.iterations) == int(plain.optimizer.iterations)
    # ... and once there is room it is saved and trained on as if nothing happened.
    model.save(tmp_path / "rescued.keras")
    rescued = keras.models.load_model(tmp_path / "rescued.keras")
    rescued.fit(X, Y, epochs=3, initial_epoch=2, **FIT)
    plain.fit(X, Y, epochs=3, initial_epoch=2, **FIT)
    assert_same_weights(rescued, plain)


@pytest.mark.parametrize(
    "code", [errno.ENOSPC, errno.EROFS, errno.EACCES], ids=["full", "ro", "denied"]
)
def test_chief_checkpoint_directory_that_cannot_be_written_fails_before_training(
    tmp_path, monkeypatch, code
):
    def no_write(*args, dir=None, **kwargs):
        raise OSError(code, os.strerror(code), os.path.join(dir, "probe"))

    monkeypatch.setattr(tempfile, "mkstemp", no_write)
    model = compiled_twin()[1]
    initial = model.get_weights()
    directory = tmp_path / "ckpt"
    with pytest.raises(
        OSError,
        match=f"cannot write to the checkpoint directory '{directory}'.*"
        f"{os.strerror(code)}",
    ):
        model.fit(
            X, Y, epochs=2, callbacks=[ChiefCheckpoint(directory / "m.keras")], **FIT
        )
    assert int(model.optimizer.iterations) == 0
    for before, after in zip(initial, model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)


def test_backup_and_restore_unwritable_directory_fails_at_the_first_save(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    plain, model = compiled_twin()
    backup = keras.callbacks.BackupAndRestore(str(blocker / "backup"))
    with pytest.raises(OSError, match="a_file"):
        model.fit(X, Y, epochs=3, callbacks=[backup], **FIT)
    # Stock Keras reports it after the first epoch, whose work is in memory.
    plain.fit(X, Y, epochs=1, **FIT)
    assert_same_weights(model, plain)


@pytest.mark.parametrize("double_checkpoint", [False, True])
def test_backup_and_restore_on_a_full_disk(tmp_path, disk, double_checkpoint):
    """`BackupAndRestore` writes its weights file in place.

    A save that fails halfway destroys the previous backup, and the next run
    cannot resume from it; with ``double_checkpoint=True`` it falls back to
    the copy of the previous backup and ends as an uninterrupted run.
    """
    backup_dir = str(tmp_path / "backup")
    model = compiled_twin()[1]

    def backup():
        return keras.callbacks.BackupAndRestore(
            backup_dir, double_checkpoint=double_checkpoint
        )

    with pytest.raises(RuntimeError, match="simulated crash"):
        model.fit(X, Y, epochs=4, callbacks=[backup(), Crash(2)], **FIT)
    disk.fill()
    with pytest.raises(OSError, match="No space left on device.*latest.weights.h5"):
        model.fit(X, Y, epochs=4, callbacks=[backup()], **FIT)
    disk.free()
    assert disk.failed_writes == 1

    resumed = compiled_twin()[1]
    if not double_checkpoint:
        with pytest.raises(OSError, match="Unable to synchronously open file"):
            resumed.fit(X, Y, epochs=4, callbacks=[backup()], **FIT)
        return
    history = resumed.fit(X, Y, epochs=4, callbacks=[backup()], **FIT)
    assert history.epoch == [2, 3]
    plain = compiled_twin()[0]
    plain.fit(X, Y, epochs=4, **FIT)
    assert_same_weights(resumed, plain)


# -- Non-finite losses.


def poisoned(kind, index=9):
    """The data with a NaN input, or an Inf target, at example `index`."""
    x, y = X.copy(), Y.copy()
    if kind == "nan":
        x[index, 0] = np.nan
    else:
        y[index, 0] = 1e30  # its squared error overflows float32 to inf
    return x, y


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_non_finite_loss_stops_training_as_on_one_device(kind):
    x, y = poisoned(kind)
    plain, model = compiled_twin()
    stop = keras.callbacks.TerminateOnNaN
    expected = plain.fit(x, y, epochs=3, callbacks=[stop()], **FIT)
    history = model.fit(x, y, epochs=3, callbacks=[stop()], **FIT)  # returns
    assert model.stop_training and plain.stop_training
    assert history.epoch == expected.epoch == [0]
    assert not np.isfinite(history.history["loss"][0])
    assert_close(history.history["loss"], expected.history["loss"])
    # Both stopped after the step of batch 2, the one holding example 9.
    assert int(model.optimizer.iterations) == int(plain.optimizer.iterations) == 3
    assert_same_weights(model, plain)


def batches(x, y, poison_epoch=None, poison_batch=None, epochs=6):
    """`epochs` epochs of 4 micro-batches, one a NaN micro-batch if asked."""
    xs, ys = [], []
    for epoch in range(epochs):
        xe = x.copy()
        if epoch == poison_epoch:
            xe[4 * poison_batch : 4 * poison_batch + 4] = np.nan
        xs.append(xe)
        ys.append(y)
    return tf.data.Dataset.from_tensor_slices((np.concatenate(xs), np.concatenate(ys)))


class AccumulatorAtStart(keras.callbacks.Callback):
    """Records the accumulator's pending window when training starts."""

    def __init__(self, accumulation):
        super().__init__()
        self.accumulation = accumulation
        self.seen = []

    def on_train_begin(self, logs=None):
        accumulator = self.accumulation._accumulator
        sums = [s.numpy() for s in accumulator.window.sums]
        self.seen.append((self.accumulation.pending_examples, sums))


def accumulation_run(tmp_path, epochs=4):
    """Two-tower model, 2 micro-batches per update, checkpoints every epoch."""
    model = compiled_twin()[1]
    accumulation = GradientAccumulation(2)
    callbacks = [
        ChiefCheckpoint(tmp_path / "{epoch:02d}.keras", resume=True),
        accumulation,
        AccumulatorAtStart(accumulation),
        keras.callbacks.TerminateOnNaN(),
    ]
    return model, callbacks


def fit_with_a_nan_micro_batch(model, callbacks):
    """Fits 4 epochs whose epoch 2 has a NaN micro-batch 3.

    With `accumulation_run`'s windows of 2, it is the second half of the
    epoch's second window.
    """
    data = batches(X, Y, poison_epoch=2, poison_batch=3).batch(4)
    return model.fit(
        data,
        epochs=4,
        steps_per_epoch=STEPS,
        callbacks=callbacks,
        verbose=0,
        shuffle=False,
    )


def test_nan_micro_batch_does_not_poison_windows_after_resume(tmp_path):
    model, callbacks = accumulation_run(tmp_path)
    history = fit_with_a_nan_micro_batch(model, callbacks)
    assert history.epoch == [0, 1, 2] and np.isnan(history.history["loss"][-1])
    assert not all(np.isfinite(w).all() for w in model.get_weights())
    # The failed epoch is not saved: the last checkpoint is the good 02.keras.
    assert names(tmp_path) == ["01.keras", "02.keras"]

    # Resume on clean data with the same model object and callbacks.
    history = model.fit(X, Y, epochs=4, callbacks=callbacks, **FIT)
    assert history.epoch == [2, 3]
    at_start = callbacks[2].seen[-1]
    assert at_start[0] == 0 and not any(s.any() for s in at_start[1])

    reference, reference_callbacks = accumulation_run(tmp_path / "clean")
    reference.fit(X, Y, epochs=4, callbacks=reference_callbacks, **FIT)
    assert_same_weights(model, reference, rtol=1e-6, atol=1e-7)
    assert all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.parametrize("accumulate", [False, True])
def test_rerun_after_a_nan_stop_resumes_from_the_last_good_checkpoint(
    tmp_path, accumulate
):
    model, callbacks = accumulation_run(tmp_path)
    if not accumulate:
        callbacks = [callbacks[0], callbacks[3]]
    fit_with_a_nan_micro_batch(model, callbacks)
    # The user fixes the data and runs the same command again.
    fresh, fresh_callbacks = accumulation_run(tmp_path)
    if not accumulate:
        fresh_callbacks = [fresh_callbacks[0], fresh_callbacks[3]]
    history = fresh.fit(X, Y, epochs=4, callbacks=fresh_callbacks, **FIT)
    reference, reference_callbacks = accumulation_run(tmp_path / "clean")
    if not accumulate:
        reference_callbacks = [reference_callbacks[0]]
    reference.fit(X, Y, epochs=4, callbacks=reference_callbacks, **FIT)
    assert history.epoch == [2, 3]
    assert_same_weights(fresh, reference, rtol=1e-6, atol=1e-7)


# -- A killed chief.

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_worker.py"
sys.path.insert(0, str(EXAMPLE.parent))


@pytest.mark.slow
def test_killing_the_chief_stops_the_other_worker_with_an_error(tmp_path):
    from multi_worker import free_ports

    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    workers = []
    for index in range(2):
        task = {"type": "worker", "index": index}
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": task})
        command = [sys.executable, str(EXAMPLE), "--worker", "--out", str(tmp_path)]
        command += ["--epochs", "1000"]  # no collective timeout
        workers.append(
            subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    chief, other = workers
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "ckpt" / "epoch2.keras").exists():
            assert time.monotonic() < deadline, "training never started"
            assert chief.poll() is None and other.poll() is None
            time.sleep(0.05)
        chief.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = other.communicate(timeout=120)
        elapsed = time.monotonic() - killed_at
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    assert chief.returncode == -signal.SIGKILL
    assert other.returncode != 0
    assert "UnavailableError" in output, output[-3000:]
    assert elapsed < 60
    assert not (tmp_path / "worker1.npz").exists()
