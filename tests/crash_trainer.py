"""A small checkpointed training run that the crash-recovery tests kill and resume.

Run as ``python tests/crash_trainer.py --ckpt DIR --out FILE --mode chief|backup``.
It trains a two-tower `TowerModel` (an MLP with Adam) on fixed data, without
shuffling or dropout, for `EPOCHS` short epochs, and checkpoints after every
epoch with ``ChiefCheckpoint(resume=True)`` (``--mode chief``) or
``keras.callbacks.BackupAndRestore`` (``--mode backup``). Started again on
the same ``--ckpt`` it resumes from the last checkpoint. When it finishes it
writes the final weights to ``--out`` (an ``.npz`` file).

It prints one line per event, flushed at once, so that a test reading the
pipe knows where the run was when it was killed:

- ``TRAINING <first epoch>`` once the checkpoint is restored;
- ``EPOCH <e>`` at the start of each epoch (0-based);
- ``SAVE <e>`` / ``SAVED <e>`` around each epoch-end save;
- ``IN_SAVE <e>`` with ``--pause-in-save E``, which then sleeps `PAUSE`
  seconds inside the save of epoch ``E``: for ``chief`` after the temporary
  file is written and before it is renamed onto the checkpoint path, for
  ``backup`` after the weights file is written and before the epoch number is;
- ``DONE`` after ``--out`` is written.

``--serve`` imports TensorFlow first, prints ``READY`` and then reads the
other arguments from stdin, as one JSON list on one line: the tests start the
next trainer while the current trial still runs.

``--kill-at-step N`` makes the process SIGKILL itself after training step
``N`` (counted from the start of this run, 1-based): a kill at an exact,
reproducible moment between two steps.

The tests import `build_model`, `training_data`, `checkpoint_callbacks` and
`FIT` from here, so that the reference runs use exactly this setup.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

TOWERS = 2
EPOCHS = 12
FIT = dict(batch_size=8, shuffle=False, verbose=0)  # global batch: 4 per tower
CHIEF_PATTERN = "{epoch:03d}.keras"
PAUSE = 2.0


def training_data():
    """32 fixed examples: 4 global batches of 8 per epoch."""
    import numpy as np

    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 4)).astype("float32")
    y = np.tanh(x @ np.array([[0.5], [-1.0], [0.25], [2.0]], "float32"))
    return x, y.astype("float32")


def build_model(seed: int = 0):
    """A compiled two-tower MLP; `seed` sets the initial weights."""
    import keras

    import kerastower

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    model = kerastower.TowerModel(inputs, outputs, towers=TOWERS)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    return model


def checkpoint_callbacks(mode: str, ckpt: str) -> list:
    """The checkpoint callback of `mode`, writing into directory `ckpt`."""
    import keras

    import kerastower

    if mode == "chief":
        path = os.path.join(ckpt, CHIEF_PATTERN)
        return [kerastower.callbacks.ChiefCheckpoint(path, resume=True)]
    if mode == "backup":
        return [keras.callbacks.BackupAndRestore(ckpt)]
    raise ValueError(f"`mode` must be 'chief' or 'backup'. Received: mode={mode!r}")


def say(*words) -> None:
    print(*words, flush=True)


def _instrument(checkpoint, model, mode: str, pause_in_save: int | None) -> None:
    """Prints markers around each epoch-end save; pauses inside one of them."""
    epoch = [None]
    save = checkpoint._save_model

    def marked_save(*args, **kwargs):
        epoch[0] = kwargs.get("epoch", getattr(checkpoint, "_current_epoch", 0) - 1)
        say("SAVE", epoch[0])
        save(*args, **kwargs)
        say("SAVED", epoch[0])

    checkpoint._save_model = marked_save
    if pause_in_save is None:
        return
    # chief: the temporary file is written, not yet renamed onto the real path.
    # backup: the weights file is written, the epoch number is not yet.
    owner, name = (
        (checkpoint, "_save_to") if mode == "chief" else (model, "save_weights")
    )
    write = getattr(owner, name)

    def slow_write(*args, **kwargs):
        write(*args, **kwargs)
        if epoch[0] == pause_in_save:
            say("IN_SAVE", epoch[0])
            time.sleep(PAUSE)

    setattr(owner, name, slow_write)


def warm_up() -> None:
    """Imports TensorFlow, sets up the towers' devices, starts the runtime."""
    import kerastower

    kerastower.configure_logical_devices(TOWERS)
    import keras

    keras.ops.zeros(1)


def run(args) -> None:
    warm_up()
    import keras
    import numpy as np

    class Markers(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps = 0

        def on_train_begin(self, logs=None):
            say("TRAINING", self.model._initial_epoch or 0)

        def on_epoch_begin(self, epoch, logs=None):
            say("EPOCH", epoch)

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == args.kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)

    model = build_model(seed=args.seed)
    callbacks = checkpoint_callbacks(args.mode, args.ckpt)
    _instrument(callbacks[0], model, args.mode, args.pause_in_save)
    x, y = training_data()
    model.fit(x, y, epochs=EPOCHS, callbacks=[*callbacks, Markers()], **FIT)
    np.savez(args.out, *model.get_weights())
    say("DONE")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", help="checkpoint directory")
    parser.add_argument("--out", help="final weights (.npz)")
    parser.add_argument("--mode", choices=("chief", "backup"))
    parser.add_argument("--seed", type=int, default=0, help="initial weights")
    parser.add_argument("--pause-in-save", type=int, default=None)
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument(
        "--serve",
        action="store_true",
        help="import TensorFlow, print READY, then read the other arguments "
        "from stdin as one JSON list",
    )
    args = parser.parse_args(argv)
    if args.serve:
        warm_up()
        say("READY")
        args = parser.parse_args(json.loads(sys.stdin.readline()))
    if not (args.ckpt and args.out and args.mode):
        parser.error("--ckpt, --out and --mode are required")
    run(args)
    sys.stdout.flush()
    os._exit(0)  # TensorFlow's interpreter teardown takes seconds; skip it.


if __name__ == "__main__":
    main()
