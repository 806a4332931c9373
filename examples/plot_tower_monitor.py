"""Train with TowerMonitor, read its TensorBoard event files back, plot them.

    python examples/plot_tower_monitor.py --epochs 6 --out docs/img/tower-monitor.png

Trains the digits convnet on 4 towers twice, with global batches of 30 and
120, writing TensorBoard logs with `kerastower.callbacks.TowerMonitor`; then
reads the event files (what TensorBoard shows) and draws throughput, step
time and each tower's work with matplotlib.
"""

import argparse
import os
import tempfile
from importlib import resources

import tensorflow as tf

import kerastower

if not tf.config.list_physical_devices("GPU"):
    kerastower.configure_logical_devices(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from kerastower.cli.demo import build_convnet  # noqa: E402


def convnet():
    # The demo's digits convnet (kerastower demo), on 4 towers.
    model = kerastower.TowerModel.from_model(build_convnet(seed=0), towers=4)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def train(log_dir, batch_size, epochs):
    # The digits that `kerastower demo` trains on ship inside the package.
    with (resources.files("kerastower") / "cli" / "digits.npz").open("rb") as file:
        digits = np.load(file)
        x = (digits["images"] / 16.0).astype("float32")[..., None][:1437]
        y = digits["labels"].astype("int32")[:1437]
    # --8<-- [start:monitor]
    monitor = kerastower.callbacks.TowerMonitor(log_dir)
    model = convnet()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, callbacks=[monitor])
    # tensorboard --logdir <log_dir>: charts "towers/..." and one line per
    # tower in the charts "tower/..."
    # --8<-- [end:monitor]


def scalars(run_dir):
    """Returns {tag: (steps, values)} read from one run's event files."""
    events = EventAccumulator(run_dir)
    events.Reload()
    result = {}
    for tag in events.Tags()["tensors"]:
        points = events.Tensors(tag)
        result[tag] = (
            np.array([p.step for p in points]) + 1,
            np.array([float(tf.make_ndarray(p.tensor_proto)) for p in points]),
        )
    return result


def plot(runs, towers, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(10, 6.4))
    (throughput, step_time), (examples, batch) = axes
    width = 0.8 / len(runs)
    for k, (label, log_dir) in enumerate(runs):
        run = scalars(os.path.join(log_dir, "towers"))
        throughput.plot(*run["towers/examples_per_second"], "o-", label=label)
        step_time.plot(*run["towers/step_time_ms"], "o-", label=label)
        per_tower = [
            scalars(os.path.join(log_dir, "towers", f"tower_{i}"))
            for i in range(towers)
        ]
        offsets = np.arange(towers) + (k - (len(runs) - 1) / 2) * width
        examples.bar(
            offsets, [t["tower/examples"][1][-1] for t in per_tower], width, label=label
        )
        batch.bar(
            offsets,
            [t["tower/batch_size"][1][-1] for t in per_tower],
            width,
            label=label,
        )
    throughput.set(title="towers/examples_per_second", xlabel="epoch")
    step_time.set(title="towers/step_time_ms", xlabel="epoch")
    examples.set(
        title="tower/examples (last epoch)", xlabel="tower", xticks=range(towers)
    )
    batch.set(
        title="tower/batch_size (share of the global batch)",
        xlabel="tower",
        xticks=range(towers),
    )
    for axis in axes.flat:
        axis.grid(True, alpha=0.3)
    throughput.legend(fontsize=8)
    step_time.legend(fontsize=8)
    for axis in (examples, batch):
        axis.set_ylim(0, axis.get_ylim()[1] * 1.25)  # room for the legend
        axis.legend(fontsize=8, loc="upper center", ncol=2)
    figure.suptitle(
        "TowerMonitor, read back from TensorBoard event files: digits convnet, "
        f"{towers} towers ({kerastower.available_devices()[0]} ...)",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", default="tower-monitor.png")
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    root = args.log_dir or tempfile.mkdtemp(prefix="kerastower-monitor-")
    runs = []
    for batch_size in (30, 120):
        log_dir = os.path.join(root, f"batch_{batch_size}")
        train(log_dir, batch_size, args.epochs)
        runs.append((f"global batch {batch_size}", log_dir))
    plot(runs, 4, args.out)


if __name__ == "__main__":
    main()
