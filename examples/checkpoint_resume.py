"""Checkpoint every epoch, stop, resume: the same weights as a run never stopped.

    python examples/checkpoint_resume.py --epochs 4 --crash-after 2

The first `fit` saves a checkpoint per epoch with `ChiefCheckpoint` and stops
after epoch `--crash-after`, as a crashed or preempted job would. A fresh
model (as in a new process) with ``resume=True`` restores the last
checkpoint, optimizer state included, and finishes the remaining epochs. A
second resume, by hand, loads the latest checkpoint with
`keras.models.load_model` and starts `fit` at the epoch in its name. The
weights of both are compared with a run that was never interrupted.
"""

import argparse
import os
import tempfile

# --8<-- [start:setup]
import keras
import numpy as np

import kerastower

kerastower.configure_logical_devices(2)  # without GPUs: 2 logical CPUs as towers

rng = np.random.default_rng(0)
x, x_val = rng.normal(size=(2, 250, 6)).astype("float32")
y, y_val = (np.sin(v.sum(axis=1, keepdims=True)) for v in (x, x_val))
filepath = "checkpoints/{epoch:03d}-{val_loss:.4f}.keras"
epochs = 4
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=epochs)
parser.add_argument("--crash-after", type=int, default=2)
parser.add_argument("--dir", default=None, help="checkpoint directory")
args = parser.parse_args()
epochs = args.epochs
directory = args.dir or tempfile.mkdtemp(prefix="kerastower-ckpt-")
filepath = os.path.join(directory, "checkpoints", os.path.basename(filepath))


class Crash(keras.callbacks.Callback):
    """Stops training after an epoch, as a crash would (the tests' stand-in)."""

    def __init__(self, after_epoch):
        super().__init__()
        self.after_epoch = after_epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.after_epoch:
            self.model.stop_training = True


# --8<-- [start:train]


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


model = build()
# After a crash, run the script again: the latest checkpoint is loaded
# (optimizer state included) and training goes on from the epoch after it.
checkpoint = kerastower.callbacks.ChiefCheckpoint(filepath, resume=True)
callbacks = [checkpoint]
# --8<-- [end:train]
callbacks.append(Crash(after_epoch=args.crash_after))
# --8<-- [start:fit]

model.fit(
    x,
    y,
    batch_size=32,
    epochs=epochs,  # the whole run: a resumed run trains only what is left
    validation_data=(x_val, y_val),
    shuffle=False,
    callbacks=callbacks,
)
# --8<-- [end:fit]
saved = sorted(os.listdir(os.path.dirname(filepath)))
print(f"first run stopped after epoch {args.crash_after}; checkpoints: {saved}")

# --8<-- [start:by_hand]

path = kerastower.callbacks.latest_checkpoint(filepath)  # None if there is none
if path is not None:
    model = keras.models.load_model(path)  # a TowerModel, with its optimizer state
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=epochs,
        initial_epoch=kerastower.callbacks.checkpoint_epoch(path, filepath),
        validation_data=(x_val, y_val),
        shuffle=False,
    )
# --8<-- [end:by_hand]
if path is None:
    raise SystemExit(f"no checkpoint matches {filepath}")
by_hand = model
print(f"resumed by hand a {type(by_hand).__name__} from {os.path.basename(path)}")

# A new process: the same script, run again after the crash.
resumed = build()
history = resumed.fit(
    x,
    y,
    batch_size=32,
    epochs=epochs,
    validation_data=(x_val, y_val),
    shuffle=False,
    callbacks=[kerastower.callbacks.ChiefCheckpoint(filepath, resume=True)],
    verbose=0,
)
print(f"resumed run trained epochs {history.epoch[0] + 1} to {epochs}")

uninterrupted = build()
uninterrupted.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0)
difference = max(
    float(np.max(np.abs(a - b)))
    for other in (resumed, by_hand)
    for a, b in zip(other.get_weights(), uninterrupted.get_weights())
)
print(f"max |w_resumed - w_uninterrupted| = {difference:.1e} (both resumes)")
if difference > 1e-6:
    raise SystemExit("the resumed run did not match the uninterrupted one")
