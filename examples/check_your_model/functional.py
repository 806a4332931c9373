"""A functional model's towers against one device, in float64 and float32.

Run it from the repository root:

    python examples/check_your_model/functional.py
"""

import keras
import numpy as np

import kerastower
from kerastower.testing import compare_with_one_device

kerastower.configure_logical_devices(3)  # without GPUs: 3 logical CPUs as towers


def build(towers):
    """A new compiled model: a TowerModel on `towers`, or for 1 one device's."""
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = kerastower.TowerModel(inputs, outputs, towers=towers)
    model.compile(
        optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(200, 8))
y = np.argmax(x[:, :3] + 0.5 * x[:, 3:6], axis=1)

# Global batch 24 on 3 towers: 8 + 8 + 8, and a last batch of 8 (3 + 3 + 2).
report = compare_with_one_device(build, x, y, towers=3, batch_size=24, epochs=5)
print(report)
float32 = compare_with_one_device(
    build, x, y, towers=3, batch_size=24, epochs=5, dtype="float32"
)
print(float32)
if not (report.same and float32.same):
    raise SystemExit("the towers did not train one device's model")
