"""A loss that compares the examples of a batch: DIFFERENT, then fixed.

Run it from the repository root:

    python examples/check_your_model/coupled_loss.py
"""

import keras
import numpy as np
from keras import ops

import kerastower
from kerastower.testing import compare_with_one_device

kerastower.configure_logical_devices(3)  # without GPUs: 3 logical CPUs as towers


def scaled_mse(y_true, y_pred):
    # Each example's squared error over the batch's mean squared target:
    # the loss of one example depends on the others.
    scale = ops.mean(ops.square(y_true))
    return ops.mean(ops.square(y_pred - y_true), axis=-1) / scale


def builder(global_batch_loss):
    def build(towers):
        inputs = keras.Input((4,))
        outputs = keras.layers.Dense(1)(keras.layers.Dense(8, "tanh")(inputs))
        model = kerastower.TowerModel(
            inputs, outputs, towers=towers, global_batch_loss=global_batch_loss
        )
        model.compile(optimizer="sgd", loss=scaled_mse)
        return model

    return build


rng = np.random.default_rng(0)
x = rng.normal(size=(60, 4))
y = x.sum(axis=1, keepdims=True)
reports = {}
for global_batch_loss in (False, True):
    reports[global_batch_loss] = compare_with_one_device(
        builder(global_batch_loss), x, y, towers=3, batch_size=12, epochs=2
    )
    print(f"global_batch_loss={global_batch_loss}: {reports[global_batch_loss]}")
if reports[False].same or not reports[True].same:
    raise SystemExit("expected DIFFERENT without global_batch_loss, same with it")
