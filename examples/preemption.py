"""Preempted mid-epoch, resumed at that step: the weights of a run never stopped.

    python examples/preemption.py --preempt-at 7

`kerastower.callbacks.BackupAndRestore` backs training up every few steps.
Here the run sends itself SIGTERM during step `--preempt-at`, as a cloud
scheduler does before it stops a machine: the callback backs up that very
step and stops training (a script would exit with status 143; here
``exit_code=None`` makes `fit` return, so that one process can show both
runs). A fresh model, as in the new process after the restart, resumes in
the middle of the epoch and finishes; its weights are compared with a run
that was never interrupted.
"""

import argparse
import os
import signal
import tempfile

# --8<-- [start:setup]
import keras
import numpy as np

import kerastower

kerastower.configure_logical_devices(2)  # without GPUs: 2 logical CPUs as towers

rng = np.random.default_rng(0)
x = rng.normal(size=(640, 8)).astype("float32")
y = np.sin(x.sum(axis=1, keepdims=True))


def build_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="tanh")(inputs)
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer="adam", loss="mse")
    return model


backup_dir = "backup"  # on storage every worker sees
epochs = 3
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=epochs)
parser.add_argument("--preempt-at", type=int, default=7, help="global step")
parser.add_argument("--dir", default=None, help="backup directory")
args = parser.parse_args()
epochs = args.epochs
backup_dir = os.path.join(args.dir or tempfile.mkdtemp(), backup_dir)


class Preempt(keras.callbacks.Callback):
    """Sends this process SIGTERM during one step, as a scheduler would."""

    def __init__(self, at):
        super().__init__()
        self.at, self.step = at, 0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


model = build_model()
# --8<-- [start:fit]
backup = kerastower.callbacks.BackupAndRestore(backup_dir, save_freq=5)
fit = dict(batch_size=64, epochs=epochs, shuffle=False, verbose=0)
# --8<-- [end:fit]
backup.exit_code = None  # return from fit instead of exiting the process
model.fit(x, y, **fit, callbacks=[Preempt(args.preempt_at), backup])
print(f"preempted: {backup.preempted}, backed up at step {args.preempt_at}")

# --8<-- [start:resume]
resumed = build_model()  # as in the restarted process: the same script
resumed.fit(x, y, **fit, callbacks=[backup])  # goes on from the backed-up step
# --8<-- [end:resume]

uninterrupted = build_model()
uninterrupted.fit(x, y, **fit)
difference = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(resumed.get_weights(), uninterrupted.get_weights())
)
print(f"max |w_resumed - w_uninterrupted| = {difference:.1e}")
