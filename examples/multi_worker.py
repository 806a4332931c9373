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


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def worker_data(index: int):
    """Worker 0 holds 11 examples, worker 1 holds 9: uneven last batches."""
    import numpy as np

    rng = np.random.default_rng(100 + index)
    n = 11 if index == 0 else 9
    x = rng.normal(size=(n, 5)).astype("float32")
    y = (x @ np.arange(1, 6, dtype="float32")[:, None] / 5).astype("float32")
    return x, y


def build_model(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def run_worker(args) -> None:
    # --8<-- [start:worker]
    import kerastower

    kerastower.configure_logical_devices(args.towers)
    kerastower.multi_worker.worker_strategy(timeout_seconds=args.timeout)
    import keras
    import numpy as np

    index = kerastower.worker_index()
    # Different seeds on purpose: the chief's initial weights are broadcast.
    plain = build_model(seed=index)
    if index == 0:
        np.savez(os.path.join(args.out, "initial.npz"), *plain.get_weights())
    model = kerastower.TowerModel.from_model(plain, towers=args.towers)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    callbacks = [
        kerastower.callbacks.ChiefCheckpoint(
            os.path.join(args.out, "ckpt", "epoch{epoch}.keras")
        )
    ]
    if args.accumulate > 1:
        callbacks.append(kerastower.callbacks.GradientAccumulation(args.accumulate))
    if args.exit_after_epoch is not None:
        callbacks.append(_ExitAfterEpoch(args.exit_after_epoch, index))
    x, y = worker_data(index)
    history = model.fit(
        x,
        y,
        batch_size=4,
        epochs=args.epochs,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    np.savez(os.path.join(args.out, f"worker{index}.npz"), *model.get_weights())
    if index == 0:  # predict is local: the chief alone may call it
        np.save(os.path.join(args.out, "predictions.npy"), model.predict(x, verbose=0))
    with open(os.path.join(args.out, f"history{index}.json"), "w") as f:
        json.dump(history.history, f)
    print(f"worker {index} done: loss {history.history['loss'][-1]:.6f}")
    # --8<-- [end:worker]


class _ExitAfterEpoch:
    """Simulates a worker that dies (used by the tests)."""

    def __new__(cls, epoch: int, index: int):
        import keras

        class Exit(keras.callbacks.Callback):
            def on_epoch_end(self, e, logs=None):
                if e + 1 >= epoch and index == 1:
                    os._exit(3)

        return Exit()


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
            "--towers",
            str(args.towers),
            "--timeout",
            str(args.timeout),
        ]
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
    parser.add_argument("--towers", type=int, default=2, help="towers per worker")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for results")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a collective may wait for a dead worker",
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
