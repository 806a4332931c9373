"""A loss that compares the examples of a batch: refused, then exact.

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
try:
    compare_with_one_device(builder(False), x, y, towers=3, batch_size=12, epochs=2)
except ValueError as error:  # found at the first training step, before any update
    print(f"global_batch_loss=False: ValueError: {error}")
else:
    raise SystemExit("expected a ValueError naming global_batch_loss")
report = compare_with_one_device(builder(True), x, y, towers=3, batch_size=12, epochs=2)
print(f"global_batch_loss=True: {report}")
if not report.same:
    raise SystemExit("expected the same model as one device with global_batch_loss")
