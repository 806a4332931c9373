"""A subclassed TowerModel's towers against one device.

Run it from the repository root:

    python examples/check_your_model/subclassed.py
"""

import keras
import numpy as np

import kerastower
from kerastower.testing import compare_with_one_device

kerastower.configure_logical_devices(3)  # without GPUs: 3 logical CPUs as towers


class MyModel(kerastower.TowerModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def build(towers):
    # towers=1 is one device: a TowerModel on one tower trains as a keras.Model.
    model = MyModel(towers=towers)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(100, 4))
y = np.sin(x).sum(axis=1, keepdims=True)
report = compare_with_one_device(build, x, y, towers=3, batch_size=10, epochs=3)
print(report)
if not report.same:
    raise SystemExit("the towers did not train one device's model")
