"""A subclassed TowerModel with its own `compute_loss`, checked against one device.

`TowerModel` runs `compute_loss` once per tower on that tower's shard and
weights it by the shard's share of the global batch, so a loss that is a mean
over the examples of its batch gives exactly the one-device loss:

    python examples/custom_compute_loss.py --epochs 3
"""

import argparse

# --8<-- [start:model]
import keras
import numpy as np
from keras import ops

import kerastower

kerastower.configure_logical_devices(4)  # without GPUs: 4 logical CPUs as towers


class Regressor(keras.Model):
    """A plain subclassed model whose loss is log-cosh plus its L2 penalty."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(
            32, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3)
        )
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        # A mean over the examples of the batch (here: of one tower's shard).
        error = ops.mean(ops.log(ops.cosh(y_pred - y)))
        return error + ops.sum(self.losses)  # regularization: counted once


class TowerRegressor(kerastower.TowerModel, Regressor):
    """The same model, trained over towers: TowerModel first in the bases."""


# --8<-- [end:model]


def train(cls, x, y, epochs, **kwargs):
    keras.utils.set_random_seed(0)  # same initial weights for both models
    model = cls(**kwargs)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, y, batch_size=25, epochs=epochs, shuffle=False, verbose=0)
    return model, history.history["loss"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(203, 8)).astype("float32")  # last batch: 3 examples
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(203, 1))).astype(
        "float32"
    )
    plain, plain_loss = train(Regressor, x, y, args.epochs)
    towered, tower_loss = train(TowerRegressor, x, y, args.epochs, towers=4)
    difference = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(plain.get_weights(), towered.get_weights())
    )
    print(f"loss per epoch, one device: {np.round(plain_loss, 5).tolist()}")
    print(f"loss per epoch, 4 towers:   {np.round(tower_loss, 5).tolist()}")
    print(f"max |w_towers - w_one_device| = {difference:.1e}")
    if difference > 1e-5:
        raise SystemExit("the towers did not match one device")


if __name__ == "__main__":
    main()
