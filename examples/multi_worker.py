"""Two workers on this machine, each with two towers, trained as one model.

Run ``python examples/multi_worker.py``: it starts two worker processes on
127.0.0.1 with free ports, each with its own `TF_CONFIG` and two logical CPUs
as towers. Each worker reads its own shard of the data; the loss is
normalised by the examples of all workers together, so the final weights
equal one device trained on the union of the workers' batches. Only the chief
(worker 0) writes checkpoints.

On real machines run the worker part on each host with `TF_CONFIG` set there
(see docs/guides/multi-worker.md) and leave out the launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

# --8<-- [start:imports]
import keras
import numpy as np

import kerastower


# --8<-- [end:imports]
# --8<-- [start:functions]
def worker_data(index):
    """Worker 0 holds 11 examples, worker 1 holds 9: uneven last batches."""
    rng = np.random.default_rng(100 + index)
    n = 11 if index == 0 else 9
    x = rng.normal(size=(n, 5)).astype("float32")
    y = (x @ np.arange(1, 6, dtype="float32")[:, None] / 5).astype("float32")
    return x, y


def build_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


# --8<-- [end:functions]


def run_worker(args) -> None:
    # --8<-- [start:settings]
    epochs = 3
    filepath = "checkpoints/epoch{epoch}.keras"  # on storage every worker sees
    timeout_seconds = None  # or seconds: how long a collective waits for a stuck worker
    # --8<-- [end:settings]
    epochs, timeout_seconds = args.epochs, args.timeout
    filepath = os.path.join(args.out, "ckpt", "epoch{epoch}.keras")
    # --8<-- [start:worker]

    kerastower.configure_logical_devices(2)  # no GPU: 2 logical CPUs per worker
    kerastower.worker_strategy(timeout_seconds=timeout_seconds)  # optional

    index = kerastower.worker_index()  # from TF_CONFIG, 0 on the chief
    x, y = worker_data(index)  # each worker holds its own examples
    # Different seeds on purpose: every worker starts from the chief's weights.
    model = kerastower.TowerModel.from_model(build_model(seed=index), towers=2)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    callbacks = [kerastower.callbacks.ChiefCheckpoint(filepath)]  # the chief writes
    # --8<-- [end:worker]
    if index == 0:
        np.savez(os.path.join(args.out, "initial.npz"), *model.get_weights())
    if args.accumulate > 1:
        callbacks.append(kerastower.callbacks.GradientAccumulation(args.accumulate))
    if args.exit_after_epoch is not None:
        callbacks.append(_ExitAfterEpoch(args.exit_after_epoch, index))
    # --8<-- [start:fit]

    history = model.fit(
        x,
        y,
        batch_size=4,  # the batch of this worker; the global batch is 4 + 4
        epochs=epochs,
        shuffle=False,
        verbose=2,
        callbacks=callbacks,
    )
    print(f"worker {index} done: loss {history.history['loss'][-1]:.6f}")
    # --8<-- [end:fit]
    np.savez(os.path.join(args.out, f"worker{index}.npz"), *model.get_weights())
    if index == 0:  # predict is local: the chief alone may call it
        np.save(os.path.join(args.out, "predictions.npy"), model.predict(x, verbose=0))
    with open(os.path.join(args.out, f"history{index}.json"), "w") as f:
        json.dump(history.history, f)


class _ExitAfterEpoch(keras.callbacks.Callback):
    """Simulates a worker that dies (used by the tests)."""

    def __init__(self, epoch: int, index: int):
        super().__init__()
        self.epoch, self.index = epoch, index

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.epoch and self.index == 1:
            os._exit(3)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(args) -> int:
    out = args.out or tempfile.mkdtemp(prefix="kerastower-mw-")
    os.makedirs(out, exist_ok=True)
    ports = free_ports(args.workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for i in range(args.workers):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}
        )
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        command = [
            sys.executable,
            __file__,
            "--worker",
            "--out",
            out,
            "--epochs",
            str(args.epochs),
        ]
        if args.timeout is not None:
            command += ["--timeout", str(args.timeout)]
        if args.exit_after_epoch is not None:
            command += ["--exit-after-epoch", str(args.exit_after_epoch)]
        if args.accumulate > 1:
            command += ["--accumulate", str(args.accumulate)]
        procs.append(subprocess.Popen(command, env=env))
    codes = [p.wait() for p in procs]
    print(f"workers exited with {codes}; outputs in {out}")
    return max(codes, key=abs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for results")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds a collective may wait for a stuck worker (default: no limit)",
    )
    parser.add_argument(
        "--accumulate", type=int, default=1, help="micro-batches per update"
    )
    parser.add_argument(
        "--exit-after-epoch", type=int, default=None, help=argparse.SUPPRESS
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
