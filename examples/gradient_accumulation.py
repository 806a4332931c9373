"""Exact gradient accumulation: 4 micro-batches of 16 on 2 towers = one batch of 64.

    python examples/gradient_accumulation.py --epochs 3

Trains the same model twice from the same weights: on two towers with
micro-batches of 16 accumulated 4 at a time, and on one device with global
batches of 64. The data (300 examples) ends each epoch on a short window (44
examples), which the accumulation weights by its examples, as one device does.
"""

import argparse

# --8<-- [start:setup]
import keras
import numpy as np

import kerastower

kerastower.configure_logical_devices(2)  # without GPUs: 2 logical CPUs as towers

rng = np.random.default_rng(0)
x = rng.normal(size=(300, 10)).astype("float32")
y = np.tanh(x[:, :1] * x[:, 1:2]).astype("float32")


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((10,))
    hidden = keras.layers.Dense(32, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


epochs = 3
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=epochs)
epochs = parser.parse_args().epochs

# --8<-- [start:accumulate]

model = kerastower.TowerModel.from_model(build(), towers=2)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
model.fit(
    x,
    y,
    batch_size=16,  # the global micro-batch: 8 examples per tower
    epochs=epochs,
    shuffle=False,
    callbacks=[kerastower.callbacks.GradientAccumulation(4)],  # 4 x 16 = 64
)
# --8<-- [end:accumulate]

reference = build()  # one device, batches of 4 x 16 = 64, the same initial weights
reference.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
reference.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0)
difference = max(
    float(np.max(np.abs(a - b)))
    for a, b in zip(reference.get_weights(), model.get_weights())
)
print(
    f"optimizer steps: {int(model.optimizer.iterations)} with accumulation, "
    f"{int(reference.optimizer.iterations)} on one device"
)
print(f"max |w_accumulated - w_one_device| = {difference:.1e}")
if difference > 1e-5:
    raise SystemExit("accumulation did not match one device")
