"""Checkpoint every epoch, crash, resume: the same weights as a run never stopped.

    python examples/checkpoint_resume.py --epochs 4 --crash-after 2

The first `fit` saves a checkpoint per epoch with `ChiefCheckpoint` and dies
after epoch `--crash-after`. A fresh model (as in a new process) with
``resume=True`` restores the last checkpoint, optimizer state included, and
finishes the remaining epochs. A second resume, by hand, loads the latest
checkpoint of a copy of the crashed run's directory with `keras.models.load_model`
and starts `fit` at the epoch in its name. The weights of both are compared
with a run that was never interrupted.
"""

import argparse
import os
import shutil
import tempfile

import kerastower

kerastower.configure_logical_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(hidden), towers=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


class Crash(keras.callbacks.Callback):
    def __init__(self, after_epoch):
        super().__init__()
        self.after_epoch = after_epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.after_epoch:
            raise RuntimeError(f"simulated crash after epoch {epoch + 1}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--crash-after", type=int, default=2)
    parser.add_argument("--dir", default=None, help="checkpoint directory")
    args = parser.parse_args(argv)
    directory = args.dir or tempfile.mkdtemp(prefix="kerastower-ckpt-")

    rng = np.random.default_rng(0)
    x, x_val = rng.normal(size=(2, 250, 6)).astype("float32")
    y, y_val = (np.sin(v.sum(axis=1, keepdims=True)) for v in (x, x_val))
    checkpoints = os.path.join(directory, "ckpt")

    model = build()
    try:
        # --8<-- [start:checkpoint]
        checkpoint = kerastower.callbacks.ChiefCheckpoint(
            os.path.join(checkpoints, "{epoch:03d}-{val_loss:.4f}.keras"), resume=True
        )
        model.fit(
            x,
            y,
            batch_size=32,
            epochs=args.epochs,
            validation_data=(x_val, y_val),
            shuffle=False,
            callbacks=[checkpoint, Crash(after_epoch=args.crash_after)],
        )
        # --8<-- [end:checkpoint]
    except RuntimeError as error:
        print(f"first run: {error}; checkpoints: {sorted(os.listdir(checkpoints))}")
    copy = shutil.copytree(checkpoints, os.path.join(directory, "ckpt-by-hand"))

    # --8<-- [start:resume]
    pattern = os.path.join(checkpoints, "{epoch:03d}-{val_loss:.4f}.keras")
    resumed = build()  # a new process starts here: build and compile the same model
    history = resumed.fit(
        x,
        y,
        batch_size=32,
        epochs=args.epochs,  # the same `epochs` as the interrupted run
        validation_data=(x_val, y_val),
        shuffle=False,
        callbacks=[kerastower.callbacks.ChiefCheckpoint(pattern, resume=True)],
    )
    # --8<-- [end:resume]
    print(f"resumed run trained epochs {history.epoch[0] + 1} to {args.epochs}")

    # --8<-- [start:by_hand]
    pattern = os.path.join(copy, "{epoch:03d}-{val_loss:.4f}.keras")
    path = kerastower.callbacks.latest_checkpoint(pattern)
    if path is not None:
        by_hand = keras.models.load_model(path)  # weights and optimizer state
        by_hand.fit(
            x,
            y,
            batch_size=32,
            epochs=args.epochs,
            initial_epoch=kerastower.callbacks.checkpoint_epoch(path, pattern),
            validation_data=(x_val, y_val),
            shuffle=False,
            callbacks=[kerastower.callbacks.ChiefCheckpoint(pattern)],
        )
    # --8<-- [end:by_hand]
    if path is None:
        raise SystemExit(f"no checkpoint matches {pattern}")
    print(f"resumed by hand a {type(by_hand).__name__} from {os.path.basename(path)}")

    uninterrupted = build()
    uninterrupted.fit(x, y, batch_size=32, epochs=args.epochs, shuffle=False, verbose=0)
    difference = max(
        float(np.max(np.abs(a - b)))
        for other in (resumed, by_hand)
        for a, b in zip(other.get_weights(), uninterrupted.get_weights())
    )
    print(f"max |w_resumed - w_uninterrupted| = {difference:.1e} (both resumes)")
    if difference > 1e-6:
        raise SystemExit("the resumed run did not match the uninterrupted one")


if __name__ == "__main__":
    main()
