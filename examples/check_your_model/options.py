"""The same check with replicas, XLA and gradient accumulation.

Run it from the repository root:

    python examples/check_your_model/options.py
"""

import keras
import numpy as np

import kerastower
from kerastower.testing import compare_with_one_device

kerastower.configure_logical_devices(3)  # without GPUs: 3 logical CPUs as towers


def build(towers):
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(1)(hidden)
    # The options of the model you train go here: they apply to the towers.
    model = kerastower.TowerModel(
        inputs, outputs, towers=towers, replicate_variables=True
    )
    model.compile(optimizer="adam", loss="mse", jit_compile=True)
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(150, 8))
y = x.sum(axis=1, keepdims=True)
# Updates of 2 micro-batches of 16 on the towers, batches of 32 on one device.
report = compare_with_one_device(
    build, x, y, towers=3, batch_size=16, epochs=2, accumulation_steps=2
)
print(report)
if not report.same:
    raise SystemExit("the towers did not train one device's model")
