"""A worker that stops answering, for the launcher's health report.

``python hanging.py``: two workers train a `TowerModel` with a 10 s collective
timeout; worker 1 hangs (sleeps) after train batch 3 of epoch 0, outside the
steps, so worker 0 waits inside batch 4's all-reduce until it times out.
"""

import sys
import time

import numpy as np
from tensorflow import keras

import kerastower

kerastower.worker_strategy(timeout_seconds=10)


class Hang(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if kerastower.worker_index() == 1 and batch == 3:
            time.sleep(600)


def main() -> int:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, callbacks=[Hang()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
