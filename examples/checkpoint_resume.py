"""Checkpoint every epoch, crash, resume: the same weights as a run never stopped.

    python examples/checkpoint_resume.py --epochs 4 --crash-after 2

The first `fit` saves a checkpoint per epoch with `ChiefCheckpoint` and dies
after epoch `--crash-after`. A fresh model (as in a new process) with
``resume=True`` restores the last checkpoint, optimizer state included, and
finishes the remaining epochs. Its weights are compared with a run that was
never interrupted.
"""

import argparse
import os
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
    x = rng.normal(size=(250, 6)).astype("float32")
    y = np.sin(x.sum(axis=1, keepdims=True)).astype("float32")
    fit = dict(batch_size=32, epochs=args.epochs, shuffle=False, verbose=0)

    # --8<-- [start:resume]
    path = os.path.join(directory, "{epoch:03d}.keras")
    model = build()
    try:
        model.fit(
            x,
            y,
            callbacks=[
                kerastower.callbacks.ChiefCheckpoint(path, resume=True),
                Crash(after_epoch=args.crash_after),
            ],
            **fit,
        )
    except RuntimeError as error:
        print(f"first run: {error}; checkpoints: {sorted(os.listdir(directory))}")

    resumed = build()  # a new process would start here
    history = resumed.fit(
        x, y, callbacks=[kerastower.callbacks.ChiefCheckpoint(path, resume=True)], **fit
    )
    # --8<-- [end:resume]
    print(f"resumed run trained epochs {history.epoch[0] + 1} to {args.epochs}")

    uninterrupted = build()
    uninterrupted.fit(x, y, **fit)
    difference = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(resumed.get_weights(), uninterrupted.get_weights())
    )
    print(f"max |w_resumed - w_uninterrupted| = {difference:.1e}")
    if difference > 1e-6:
        raise SystemExit("the resumed run did not match the uninterrupted one")


if __name__ == "__main__":
    main()
