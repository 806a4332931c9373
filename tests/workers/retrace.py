"""Workers whose steps trace a different number of times.

``python retrace.py OUT``: two workers train a model with synchronised
`BatchNormalization` by ``train_on_batch``. Worker 1's last batch is shorter
than its others, so Keras traces its step again; worker 0's batches all have
one shape, and it does not. Both must still meet in every sum over the
workers. Writes the chief's initial weights and each worker's final weights
to ``OUT``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from tensorflow import keras

import kerastower

SIZES = ([4, 4, 4], [4, 4, 3])  # worker 1 traces its step twice


def worker_data(index: int):
    rng = np.random.default_rng(200 + index)
    x = rng.normal(size=(sum(SIZES[index]), 5))  # float64: exact sums
    return x, x[:, :1] * 2.0 - x[:, 1:2]


def graph(seed: int):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,), dtype="float64")
    # No bias before the normalisation: its gradient is zero but for
    # rounding, which Adam would blow up to steps of the learning rate.
    dense = keras.layers.Dense(8, use_bias=False, dtype="float64")(inputs)
    hidden = keras.layers.BatchNormalization(dtype="float64")(dense)
    return inputs, keras.layers.Dense(1, dtype="float64")(hidden)


def main(out: str) -> None:
    index = kerastower.worker_index()
    # One seed: `train_on_batch` does not broadcast the chief's weights.
    model = kerastower.TowerModel(*graph(seed=0))
    if index == 0:
        np.savez(os.path.join(out, "initial.npz"), *model.get_weights())
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = worker_data(index)
    start = 0
    for size in SIZES[index]:
        model.train_on_batch(x[start : start + size], y[start : start + size])
        start += size
    np.savez(os.path.join(out, f"worker{index}.npz"), *model.get_weights())


if __name__ == "__main__":
    main(sys.argv[1])
