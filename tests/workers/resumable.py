"""A resumable training run that the preemption tests stop and start again.

``python resumable.py OUT [--accumulate K] [--sigterm-at S] [--kill-at S]``
trains a `TowerModel` (an MLP with Adam, no shuffling, no dropout) for
`EPOCHS` epochs of `STEPS` steps with `kerastower.callbacks.BackupAndRestore`
backing up every step in ``OUT/backup``. On one machine it uses two towers;
under ``kerastower launch`` every worker holds its own examples. Started
again on the same ``OUT`` it resumes from the backup. It prints ``STEP e s``
after each step (flushed), and writes the final weights to
``OUT/final{worker}.npz`` and the history of this run to
``OUT/history{worker}.json``.

``--sigterm-at S`` makes the process send itself ``SIGTERM`` during global
step ``S`` (0-based, counted over the whole training, this run's epochs
included), as a scheduler would; ``--kill-at S`` sends ``SIGKILL`` instead.
``--only-worker W`` limits both to worker ``W``; ``--only-first-start``
to the first start under ``kerastower launch --max-restarts`` (where
``KERASTOWER_RESTART_COUNT`` is 0); ``--kill-delay D`` sends the signal D
seconds after the step, from a timer (so that it lands in a later step or in
a backup). ``--check-freq C`` is `BackupAndRestore`'s ``check_freq``.

``--global-batch G`` makes the data one set of ``G * STEPS`` examples that
every worker reads and shards (`kerastower.cluster.shard`), each worker
fitting ``G / W`` examples per step: the global batches are the same for
any number of workers ``W`` that divides ``G``, so a run backed up on some
workers can resume on others. ``--batch B`` overrides the per-worker
batch. This mode trains in float64.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

import numpy as np
from tensorflow import keras

import kerastower

EPOCHS = 3
BATCH = 8  # per worker
STEPS = 4


def worker_data(index: int):
    rng = np.random.default_rng(7 + index)
    x = rng.normal(size=(BATCH * STEPS, 4)).astype("float32")
    y = np.tanh(x @ np.array([[0.5], [-1.0], [0.25], [2.0]], "float32"))
    return x, y.astype("float32")


def global_data(global_batch: int):
    """One data set of `global_batch * STEPS` examples, this worker's shard."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(global_batch * STEPS, 4))
    y = np.tanh(x @ np.array([[0.5], [-1.0], [0.25], [2.0]]))
    return kerastower.cluster.shard((x, y))


def build_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


class Interrupt(keras.callbacks.Callback):
    """Signals this process in the middle of global step `at`."""

    def __init__(self, at: int, signum: int, delay: float = 0.0):
        super().__init__()
        self.at, self.signum, self.delay = at, signum, delay

    def on_train_batch_begin(self, batch, logs=None):
        self.epoch_batch = batch

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * STEPS + batch == self.at:
            args = (os.getpid(), self.signum)
            threading.Timer(self.delay, os.kill, args).start()


class Report(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        print(f"STEP {self.epoch} {batch}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--sigterm-at", type=int, default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--only-worker", type=int, default=None)
    parser.add_argument("--check-freq", type=int, default=1)
    parser.add_argument("--only-first-start", action="store_true")
    parser.add_argument("--kill-delay", type=float, default=0.0)
    parser.add_argument("--global-batch", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    args = parser.parse_args(argv)
    if not kerastower.is_multi_worker():
        kerastower.configure_logical_devices(2)
    index = kerastower.worker_index()
    batch = BATCH
    if args.global_batch is None:
        x, y = worker_data(index)
    else:
        # Float64: another number of workers sums in another order, and in
        # float32 that rounding, not the resume, would set the difference.
        keras.backend.set_floatx("float64")
        keras.mixed_precision.set_global_policy("float64")
        x, y = global_data(args.global_batch)
        batch = args.global_batch // kerastower.num_workers()
    batch = args.batch or batch
    model = build_model()
    callbacks = [Report()]
    restarted = os.environ.get("KERASTOWER_RESTART_COUNT", "0") != "0"
    if args.only_worker in (None, index) and not (args.only_first_start and restarted):
        if args.sigterm_at is not None:
            callbacks.append(Interrupt(args.sigterm_at, signal.SIGTERM))
        if args.kill_at is not None:
            callbacks.append(Interrupt(args.kill_at, signal.SIGKILL, args.kill_delay))
    if args.accumulate > 1:
        callbacks.append(kerastower.callbacks.GradientAccumulation(args.accumulate))
    backup_dir = os.path.join(args.out, "backup")
    backup = kerastower.callbacks.BackupAndRestore(
        backup_dir, save_freq=1, check_freq=args.check_freq
    )
    callbacks.append(backup)
    history = model.fit(
        x,
        y,
        batch_size=batch,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    np.savez(os.path.join(args.out, f"final{index}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"history{index}.json"), "w") as f:
        json.dump(dict(history.history, epochs=history.epoch), f)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
