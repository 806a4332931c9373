"""Where stock Keras multi-device training goes wrong, and TowerModel does not.

Trains the same small model three ways, from the same initial weights, on the
same batches: a plain `keras.Model` on one device (the reference), the same
model under `tf.distribute.MirroredStrategy` (stock Keras), and a
`kerastower.TowerModel`. Prints the largest weight difference from the
reference after each epoch, for global batch sizes that do not divide evenly
across the replicas:

    python examples/stock_keras_gap.py --epochs 3
    python examples/stock_keras_gap.py --plot docs/img/stock-keras-gap.png

Runs on logical CPUs, so it needs no GPU.
"""

from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerastower  # noqa: E402

kerastower.configure_logical_devices(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# (examples, global batch size, replicas): what happens to the last batch.
CASES = [(30, 10, 3), (20, 5, 2), (21, 8, 2), (23, 8, 2), (24, 8, 2)]


def build(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(7, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype("float32")
    y = rng.normal(size=(n, 1)).astype("float32")
    return x, y


def max_difference(a, b):
    return max(
        float(np.max(np.abs(u - v)))
        for u, v in zip(a.get_weights(), b.get_weights(), strict=True)
    )


def compare(examples, batch_size, replicas, epochs):
    """Returns the per-epoch max weight difference from one device, or an error.

    Returns:
        ``{"mirrored": [...] or "<error>", "towers": [...]}``, one difference
        per epoch.
    """
    x, y = data(examples)
    reference = build()
    devices = [f"/device:CPU:{i}" for i in range(replicas)]
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        mirrored = build()
    towers = kerastower.TowerModel.from_model(build(), towers=replicas)
    for model in (mirrored, towers):
        model.set_weights(reference.get_weights())
    for model in (reference, mirrored, towers):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")

    results = {"mirrored": [], "towers": []}
    for _ in range(epochs):
        reference.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
        towers.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
        results["towers"].append(max_difference(reference, towers))
        if isinstance(results["mirrored"], str):
            continue
        try:
            mirrored.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
        except tf.errors.InvalidArgumentError as error:
            shapes = re.search(r"(\[[0-9,]+\]) != input \d+: (\[[0-9,]+\])", str(error))
            detail = f" ({shapes.group(1)} != {shapes.group(2)})" if shapes else ""
            results["mirrored"] = f"crash: InvalidArgumentError{detail}"
            continue
        results["mirrored"].append(max_difference(reference, mirrored))
    return results


def describe(examples, batch_size, replicas):
    last = examples % batch_size
    if batch_size % replicas:
        return f"batch {batch_size} on {replicas} replicas"
    if last:
        return f"last batch {last} of {batch_size} on {replicas} replicas"
    return f"every batch {batch_size}, even on {replicas} replicas"


def plot(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.6))
    for label, values, style in curves:
        epochs = np.arange(1, len(values) + 1)
        axis.semilogy(epochs, np.maximum(values, 1e-9), style, label=label)
    axis.set_xlabel("epoch")
    axis.set_ylabel("max |w - w_one_device|")
    axis.set_title("21 examples, global batch 8, 2 replicas (last batch of 5)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--plot", default=None, help="also plot a PNG here")
    parser.add_argument(
        "--quick", action="store_true", help="only the first and third case"
    )
    args = parser.parse_args(argv)
    cases = [CASES[0], CASES[2]] if args.quick else CASES

    print(f"Keras {keras.__version__}, TensorFlow {tf.__version__}")
    print(f"max |w - w_one_device| after {args.epochs} epochs (SGD 0.1, MSE)")
    print(f"{'examples':>8} {'case':<38} {'MirroredStrategy':<44} TowerModel")
    for examples, batch_size, replicas in cases:
        result = compare(examples, batch_size, replicas, args.epochs)
        mirrored = result["mirrored"]
        stock = mirrored if isinstance(mirrored, str) else f"{mirrored[-1]:.1e}"
        print(
            f"{examples:>8} {describe(examples, batch_size, replicas):<38} "
            f"{stock:<44} {result['towers'][-1]:.1e}"
        )
    if args.plot:
        result = compare(21, 8, 2, max(args.epochs, 10))
        plot(
            [
                ("MirroredStrategy", result["mirrored"], "o-"),
                ("TowerModel", result["towers"], "s-"),
            ],
            args.plot,
        )


if __name__ == "__main__":
    main()
