"""Training with an evaluator beside it, as ``kerastower launch --evaluator`` runs it.

``python evaluated.py OUT``: the workers train a `TowerModel` (an MLP with
Adam) for `EPOCHS` epochs with `ChiefCheckpoint` writing
``OUT/ckpt/{epoch:02d}.keras``; the ``"evaluator"`` task evaluates each
checkpoint on `validation_data` with `SidecarEvaluator`, logging to
``OUT/logs``. Each worker writes ``OUT/done<worker>`` at the end of `fit`.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from tensorflow import keras

import kerastower

EPOCHS = 3
BATCH = 8  # per worker
STEPS = 5


def worker_data(index: int):
    rng = np.random.default_rng(11 + index)
    x = rng.normal(size=(BATCH * STEPS, 4)).astype("float32")
    return x, np.tanh(x @ np.array([[0.5], [-1.0], [0.25], [2.0]], "float32"))


def validation_data():
    return worker_data(99)


def build_model(model_class=kerastower.TowerModel):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    model = model_class(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


def main(out: str) -> int:
    filepath = os.path.join(out, "ckpt", "{epoch:02d}.keras")
    model = build_model()
    if kerastower.cluster.is_evaluator():
        x, y = validation_data()
        evaluator = kerastower.evaluator.SidecarEvaluator(
            model,
            x,
            y,
            filepath=filepath,
            batch_size=7,
            log_dir=os.path.join(out, "logs"),
            poll_interval=0.05,
        )
        print(f"EVALUATED {len(evaluator.start())}", flush=True)
        return 0
    index = kerastower.worker_index()
    x, y = worker_data(index)
    checkpoint = kerastower.callbacks.ChiefCheckpoint(filepath)
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[checkpoint],
    )
    open(os.path.join(out, f"done{index}"), "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
