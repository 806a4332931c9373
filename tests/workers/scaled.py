"""`BatchScaling` and `batch_for_towers` on workers with different tower counts.

``python scaled.py OUT``, started by ``kerastower launch -n 2 --towers 2,3``:
each worker batches its `STEPS` batches with `kerastower.batch_for_towers`
(`PER_TOWER` examples a tower, so 4 on the worker of 2 towers and 6 on that
of 3: a global batch of 10) and trains with `BatchScaling` and a warmup. The
model is one weight ``w`` (initially 0) on inputs of ones with the loss
``mean(y_pred)``, so plain SGD moves ``w`` by exactly ``-lr`` a step: the
weights show the rate each step really used. A second `fit` then passes the
global batch as ``batch_size`` on every worker, which is wrong, and keeps
the message of the error `BatchScaling` raises. Each worker writes
``OUT/scaled<worker>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras

import kerastower

PER_TOWER = 2
BASE_LEARNING_RATE = 0.01
BASE_BATCH = 2
WARMUP_EPOCHS = 2
EPOCHS = 2
STEPS = 3


class Steps(keras.callbacks.Callback):
    """Records, at each step, the rate applied: ``w`` before minus ``w`` after."""

    def __init__(self):
        super().__init__()
        self.applied = []

    def on_train_batch_begin(self, batch, logs=None):
        self.before = float(self.model.get_weights()[0][0, 0])

    def on_train_batch_end(self, batch, logs=None):
        after = float(self.model.get_weights()[0][0, 0])
        self.applied.append(self.before - after)


def main(out: str) -> None:
    index = kerastower.worker_index()
    inputs = keras.Input((1,))
    dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    model = kerastower.TowerModel(inputs, dense(inputs))
    model.compile(
        optimizer=keras.optimizers.SGD(1.0), loss=lambda y_true, y_pred: y_pred
    )
    n = STEPS * PER_TOWER * model.num_towers
    x, y = np.ones((n, 1), "float32"), np.zeros((n, 1), "float32")
    train = kerastower.batch_for_towers(
        tf.data.Dataset.from_tensor_slices((x, y)), PER_TOWER, model
    )
    sizes = [int(batch[0].shape[0]) for batch in train]
    scaling = kerastower.callbacks.BatchScaling(
        PER_TOWER, BASE_LEARNING_RATE, BASE_BATCH, warmup_epochs=WARMUP_EPOCHS
    )
    steps = Steps()
    history = model.fit(train, epochs=EPOCHS, verbose=0, callbacks=[scaling, steps])
    report = dict(
        towers=model.num_towers,
        workers=model.num_workers,
        sizes=sizes,
        global_batch_size=scaling.global_batch_size,
        worker_batch_size=scaling.worker_batch_size,
        target_learning_rate=scaling.target_learning_rate,
        learning_rate=history.history["learning_rate"],
        applied=steps.applied,
        w=float(model.get_weights()[0][0, 0]),
    )
    # The old advice: the global batch to every worker's `fit`.
    wrong = kerastower.callbacks.BatchScaling(PER_TOWER, BASE_LEARNING_RATE, BASE_BATCH)
    try:
        model.fit(
            x,
            y,
            batch_size=scaling.global_batch_size,
            shuffle=False,
            verbose=0,
            callbacks=[wrong],
        )
        report["error"] = None
    except ValueError as error:
        report["error"] = str(error)
    with open(os.path.join(out, f"scaled{index}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
