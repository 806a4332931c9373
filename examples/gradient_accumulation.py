"""Exact gradient accumulation: 4 micro-batches of 16 on 2 towers = one batch of 64.

    python examples/gradient_accumulation.py --epochs 3

Trains the same model twice from the same weights: on one device with global
batches of 64, and on two towers with micro-batches of 16 accumulated 4 at a
time. The data (300 examples) ends each epoch on a short window (44 examples),
which the accumulation weights by its examples, as one device does.
"""

import argparse

import kerastower

kerastower.configure_logical_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((10,))
    hidden = keras.layers.Dense(32, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 10)).astype("float32")
    y = np.tanh(x[:, :1] * x[:, 1:2]).astype("float32")

    reference = build()
    reference.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    reference.fit(x, y, batch_size=64, epochs=args.epochs, shuffle=False, verbose=0)

    # --8<-- [start:accumulate]
    model = kerastower.TowerModel.from_model(build(), towers=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.fit(
        x,
        y,
        batch_size=16,  # the global micro-batch: 8 examples per tower
        epochs=args.epochs,
        shuffle=False,
        callbacks=[kerastower.callbacks.GradientAccumulation(4)],  # 4 x 16 = 64
    )
    # --8<-- [end:accumulate]

    difference = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(reference.get_weights(), model.get_weights())
    )
    print(
        f"optimizer steps: {int(model.optimizer.iterations)} with accumulation, "
        f"{int(reference.optimizer.iterations)} on one device"
    )
    print(f"max |w_accumulated - w_one_device| = {difference:.1e}")
    if difference > 1e-5:
        raise SystemExit("accumulation did not match one device")


if __name__ == "__main__":
    main()
