"""Crash recovery: SIGKILL a checkpointing run at random moments, then resume it.

Each trial starts `crash_trainer.py` (a two-tower `TowerModel`, Adam, 12 short
epochs, a checkpoint after every epoch) in its own process and kills it with
SIGKILL at a moment drawn from a seeded generator:

- ``chief``: at a random instant (a random epoch, then a random fraction of
  an epoch's duration), wherever that lands, training step or save;
- ``chief`` mid-save: inside a save, after the temporary file is written and
  before it is renamed onto the checkpoint path (the trainer pauses there);
- ``backup`` (`keras.callbacks.BackupAndRestore`): between two training
  steps, at a random step.

After the kill every file at a checkpoint path must be whole and hold exactly
the state of the uninterrupted run after that many epochs. A resumed run, in
a new model with other initial weights (in this process, or in a new process
for the first trial of each kind), must start at the epoch after the last
checkpoint and end with the weights of the uninterrupted run.

`BackupAndRestore` is not atomic: it overwrites its weights file in place and
writes the epoch number in a second file. A kill between the two makes the
resumed run repeat an epoch; `test_backup_and_restore_killed_mid_save_*`
shows it. `ChiefCheckpoint(resume=True)` keeps both in one file, renamed into
place whole.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import crash_trainer as trainer
import keras
import numpy as np
import pytest

from kerastower.callbacks import checkpoint_epoch, latest_checkpoint
from kerastower.callbacks.chief_checkpoint import TEMP_PREFIX

TRAINER = Path(__file__).with_name("crash_trainer.py")
SEED = 8
STEPS_PER_EPOCH = 4
STARTUP_TIMEOUT = 180.0  # seconds until the trainer has imported TensorFlow
X, Y = trainer.training_data()
RTOL = 1e-6


class Trainer:
    """A `crash_trainer.py --serve` process and the lines it printed, timed.

    The process imports TensorFlow as soon as it starts and then waits for
    `go`, so that a trainer can warm up while the previous trial runs.
    """

    def __init__(self):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("TF_CONFIG", None)
        self.process = subprocess.Popen(
            [sys.executable, str(TRAINER), "--serve"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.closed = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def go(self, mode, ckpt, out, *extra):
        """Starts training: `crash_trainer.py --mode mode --ckpt ckpt ...`."""
        self.wait_for("READY")
        argv = ["--mode", mode, "--ckpt", str(ckpt), "--out", str(out)]
        self.process.stdin.write(json.dumps(argv + [str(e) for e in extra]) + "\n")
        self.process.stdin.flush()
        return self

    def _read(self):
        for line in self.process.stdout:
            with self._changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)[-4000:]

    def wait_for(self, marker, timeout=STARTUP_TIMEOUT) -> float:
        """Returns the time at which the trainer printed `marker`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for seen, line in self.lines:
                    if line == marker:
                        return seen
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    raise AssertionError(
                        f"the trainer never printed {marker!r}:\n{self.output()}"
                    )
                self._changed.wait(left)

    def kill(self) -> int:
        self.process.send_signal(signal.SIGKILL)
        return self.join()

    def join(self, timeout=STARTUP_TIMEOUT) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def last_marker(self) -> str:
        markers = ("EPOCH", "SAVE", "SAVED", "IN_SAVE", "DONE")
        return [ln for _, ln in self.lines if ln.split(" ")[0] in markers][-1]

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.join()
        self.process.stdin.close()
        self.process.stdout.close()


@pytest.fixture(scope="module")
def launcher():
    """Starts trainers, keeping one warmed-up trainer in reserve."""
    spare = [Trainer()]
    started = []

    def start(mode, ckpt, out, *extra):
        run, spare[0] = spare[0], Trainer()
        started.append(run)
        return run.go(mode, ckpt, out, *extra)

    yield start
    for run in [*started, *spare]:
        run.close()


def weights_match(actual, expected, what) -> float:
    """Asserts equal weights; returns the largest absolute difference."""
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=1e-7, err_msg=what)
    return max(float(np.max(np.abs(a - e))) for a, e in zip(actual, expected))


@pytest.fixture(scope="module")
def trajectory():
    """The weights of an uninterrupted run after 0, 1, ..., EPOCHS + 1 epochs."""
    model = trainer.build_model(seed=0)
    states = [model.get_weights()]
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: states.append(model.get_weights())
    )
    model.fit(X, Y, epochs=trainer.EPOCHS + 1, callbacks=[record], **trainer.FIT)
    assert len(states) == trainer.EPOCHS + 2
    return states


@pytest.fixture(scope="module")
def probe():
    """A model to load checkpoints into, with other initial weights."""
    model = trainer.build_model(seed=1)
    model.optimizer.build(model.trainable_variables)
    return model


def check_chief_files(ckpt, trajectory, probe, first=1):
    """Every file at a checkpoint path is whole and holds its epoch's state.

    Checkpoints of epochs before `first` were checked already and are only
    counted. Returns the number of checkpoints and the names of leftover
    temporary files (which are never at a checkpoint path).
    """
    names = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
    temps = [n for n in names if n.startswith(TEMP_PREFIX)]
    visible = [n for n in names if not n.startswith(TEMP_PREFIX)]
    pattern = os.path.join(str(ckpt), trainer.CHIEF_PATTERN)
    assert visible == [f"{e:03d}.keras" for e in range(1, len(visible) + 1)]
    for name in visible[first - 1 :]:
        path = os.path.join(ckpt, name)
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None, name
        probe.load_weights(path)
        epoch = checkpoint_epoch(path, pattern)
        weights_match(probe.get_weights(), trajectory[epoch], name)
        assert int(probe.optimizer.iterations.numpy()) == epoch * STEPS_PER_EPOCH
    if visible:
        whole = keras.models.load_model(latest_checkpoint(pattern))
        weights_match(whole.get_weights(), trajectory[len(visible)], "load_model")
    return len(visible), temps


def check_backup_files(ckpt, trajectory, probe):
    """The backup's weights are whole and are those of the epoch it names."""
    if not os.path.isdir(ckpt):
        return 0
    assert sorted(os.listdir(ckpt)) == ["latest.weights.h5", "training_metadata.json"]
    with open(os.path.join(ckpt, "training_metadata.json")) as f:
        epoch = json.load(f)["epoch"]
    probe.load_weights(os.path.join(ckpt, "latest.weights.h5"))
    weights_match(probe.get_weights(), trajectory[epoch], "backup")
    assert int(probe.optimizer.iterations.numpy()) == epoch * STEPS_PER_EPOCH
    return epoch


def resume(mode, ckpt, out, launcher=None):
    """Runs the interrupted training to its end; returns (first epoch, weights).

    With `launcher`, in a new process; otherwise in a new model here.
    """
    if launcher is not None:
        run = launcher(mode, ckpt, out, "--seed", 7)
        assert run.join() == 0, run.output()
        first = int(next(ln for _, ln in run.lines if ln.startswith("TRAINING"))[9:])
        with np.load(out) as saved:
            return first, [saved[f"arr_{i}"] for i in range(len(saved.files))]
    model = trainer.build_model(seed=7)
    callbacks = trainer.checkpoint_callbacks(mode, str(ckpt))
    history = model.fit(X, Y, epochs=trainer.EPOCHS, callbacks=callbacks, **trainer.FIT)
    assert history.epoch == list(range(history.epoch[0], trainer.EPOCHS))
    return history.epoch[0], model.get_weights()


def report(mode, trial, where, saved, leftovers, difference):
    """Prints where the kill landed (shown with ``pytest -s``)."""
    print(
        f"[crash] {mode} trial {trial}: killed at {where!r}; {saved} epoch(s) "
        f"saved; temporary files left: {len(leftovers)}; resumed weights differ "
        f"from the uninterrupted run by at most {difference:.1e}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(6))
def test_chief_checkpoint_survives_a_kill_at_a_random_instant(
    tmp_path, launcher, trajectory, probe, trial
):
    rng = random.Random(SEED * 1000 + trial)
    # In the first half: an epoch takes tens of milliseconds, and a test
    # thread woken late (the next trainer warms up beside it) once found the
    # run done when the kill was due two epochs before the end.
    epoch, fraction = rng.randint(1, trainer.EPOCHS // 2), rng.random()
    ckpt = tmp_path / "ckpt"
    run = launcher("chief", ckpt, tmp_path / "killed.npz")
    start = run.wait_for(f"EPOCH {epoch}")
    previous = run.wait_for(f"EPOCH {epoch - 1}", timeout=0)
    time.sleep(fraction * (start - previous))
    assert run.kill() == -signal.SIGKILL, run.output()
    saved, leftovers = check_chief_files(ckpt, trajectory, probe)

    first, weights = resume(
        "chief", ckpt, tmp_path / "out.npz", launcher if trial == 0 else None
    )
    assert first == saved
    difference = weights_match(weights, trajectory[trainer.EPOCHS], "resumed run")
    report("chief", trial, run.last_marker(), saved, leftovers, difference)
    assert check_chief_files(ckpt, trajectory, probe, first=saved + 1) == (
        trainer.EPOCHS,
        [],
    )


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(3))
def test_chief_checkpoint_survives_a_kill_in_the_middle_of_a_save(
    tmp_path, launcher, trajectory, probe, trial
):
    rng = random.Random(SEED * 2000 + trial)
    epoch = rng.randint(0, trainer.EPOCHS - 2)
    ckpt = tmp_path / "ckpt"
    run = launcher("chief", ckpt, tmp_path / "killed.npz", "--pause-in-save", epoch)
    run.wait_for(f"IN_SAVE {epoch}")
    time.sleep(rng.uniform(0, trainer.PAUSE / 4))
    assert run.kill() == -signal.SIGKILL, run.output()
    assert run.last_marker() == f"IN_SAVE {epoch}"
    saved, leftovers = check_chief_files(ckpt, trajectory, probe)
    assert saved == epoch  # the checkpoint being written is not visible
    assert len(leftovers) == 1  # only as a temporary file

    first, weights = resume("chief", ckpt, tmp_path / "out.npz")
    assert first == epoch
    difference = weights_match(weights, trajectory[trainer.EPOCHS], "resumed run")
    report("chief mid-save", trial, run.last_marker(), saved, leftovers, difference)
    assert check_chief_files(ckpt, trajectory, probe, first=saved + 1) == (
        trainer.EPOCHS,
        [],
    )


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(4))
def test_backup_and_restore_survives_a_kill_between_steps(
    tmp_path, launcher, trajectory, probe, trial
):
    rng = random.Random(SEED * 3000 + trial)
    step = rng.randint(1, trainer.EPOCHS * STEPS_PER_EPOCH - 1)
    ckpt = tmp_path / "backup"
    run = launcher("backup", ckpt, tmp_path / "killed.npz", "--kill-at-step", step)
    assert run.join() == -signal.SIGKILL, run.output()
    saved = check_backup_files(ckpt, trajectory, probe)
    assert saved == (step - 1) // STEPS_PER_EPOCH

    first, weights = resume(
        "backup", ckpt, tmp_path / "out.npz", launcher if trial == 0 else None
    )
    assert first == saved
    difference = weights_match(weights, trajectory[trainer.EPOCHS], "resumed run")
    report("backup", trial, f"after step {step}", saved, (), difference)
    assert not ckpt.exists()  # deleted at the end of a finished run


@pytest.mark.slow
def test_backup_and_restore_killed_mid_save_repeats_an_epoch(
    tmp_path, launcher, trajectory, probe
):
    """Stock `BackupAndRestore` loses consistency when killed inside a save.

    It writes ``latest.weights.h5`` and then ``training_metadata.json``. A
    kill between the two, in the save after epoch ``e + 1``, leaves the
    weights after ``e + 1`` epochs with the number ``e``: the resumed run
    trains one epoch too many and ends where an uninterrupted run of
    ``EPOCHS + 1`` epochs does. This pins that known limitation;
    `ChiefCheckpoint(resume=True)` keeps weights and epoch in one file,
    renamed into place whole, and does not have it.
    """
    epoch = 3  # 0-based: the save after 4 epochs
    ckpt = tmp_path / "backup"
    run = launcher("backup", ckpt, tmp_path / "killed.npz", "--pause-in-save", epoch)
    run.wait_for(f"IN_SAVE {epoch}")
    assert run.kill() == -signal.SIGKILL, run.output()
    with open(ckpt / "training_metadata.json") as f:
        assert json.load(f)["epoch"] == epoch  # says: `epoch` epochs done
    probe.load_weights(str(ckpt / "latest.weights.h5"))
    weights_match(probe.get_weights(), trajectory[epoch + 1], "weights: one more")

    first, weights = resume("backup", ckpt, tmp_path / "out.npz")
    assert first == epoch
    weights_match(weights, trajectory[trainer.EPOCHS + 1], "one epoch too many")
    assert not np.allclose(weights[0], trajectory[trainer.EPOCHS][0], rtol=1e-3)
