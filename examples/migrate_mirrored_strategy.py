"""From `tf.distribute.MirroredStrategy` to `kerastower.TowerModel`, side by side.

    python examples/migrate_mirrored_strategy.py --epochs 2

Trains the same model both ways on 2 logical CPUs (the data is a multiple of
the global batch, so the stock version runs too) and compares both with one
device.
"""

import argparse

# --8<-- [start:setup]
import keras
import numpy as np
import tensorflow as tf

import kerastower

kerastower.configure_logical_devices(2)  # without GPUs: 2 logical CPUs

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 12)).astype("float32")
y = x[:, :3].sum(axis=1, keepdims=True)


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


epochs = 2
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=epochs)
epochs = parser.parse_args().epochs

# --8<-- [start:before]

strategy = tf.distribute.MirroredStrategy()  # every GPU (here: the CPUs)
with strategy.scope():
    model = build()
    model.compile(optimizer="adam", loss="mse")
per_replica = 64
model.fit(
    x,
    y,
    batch_size=per_replica * strategy.num_replicas_in_sync,
    epochs=epochs,
    shuffle=False,
)
# --8<-- [end:before]
stock = model

# --8<-- [start:after]

model = kerastower.TowerModel.from_model(build())  # every GPU (here: the CPUs)
model.compile(optimizer="adam", loss="mse")
per_tower = 64
model.fit(
    x,
    y,
    batch_size=kerastower.global_batch_size(per_tower, model),
    epochs=epochs,
    shuffle=False,
)
# --8<-- [end:after]


def difference(a, b):
    return max(
        float(np.max(np.abs(u - v))) for u, v in zip(a.get_weights(), b.get_weights())
    )


reference = build()
reference.compile(optimizer="adam", loss="mse")
reference.fit(x, y, batch_size=128, epochs=epochs, shuffle=False, verbose=0)
stock_gap, tower_gap = difference(stock, reference), difference(model, reference)
print(f"MirroredStrategy: max |w - w_one_device| = {stock_gap:.1e}")
print(f"TowerModel:       max |w - w_one_device| = {tower_gap:.1e}")
if tower_gap > 1e-5:
    raise SystemExit("TowerModel did not match one device")
