"""The quickstart: one functional model, four towers, plain `fit`."""

# --8<-- [start:quickstart]
import keras
import numpy as np

import kerastower

# Without a GPU, towers run on logical CPUs: split the CPU into 4 before the first
# model or tensor. (With GPUs, TowerModel uses the GPUs and this changes nothing.)
kerastower.configure_logical_devices(4)

inputs = keras.Input((20,))
hidden = keras.layers.Dense(64, activation="relu")(inputs)
outputs = keras.layers.Dense(1)(hidden)
model = kerastower.TowerModel(inputs, outputs)  # every GPU, else every logical CPU
model.compile(optimizer="adam", loss="mse", metrics=["mae"])

x = np.random.default_rng(0).normal(size=(1000, 20)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model.fit(x, y, batch_size=30, epochs=2)  # global batch 30: 8 + 8 + 7 + 7 per tower
print(model.num_towers, "towers:", model.tower_devices)
# --8<-- [end:quickstart]
