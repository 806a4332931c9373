"""A small convnet on handwritten digits, trained over several towers.

The digits (scikit-learn's 1,797 8x8 images) ship with kerastower, so this
runs offline:

    python examples/digits_convnet.py --towers 4 --epochs 5 --log-dir logs/digits
    tensorboard --logdir logs/digits

With GPUs the towers are the GPUs; without, the CPU is split into `--towers`
logical devices. `TowerMonitor` writes throughput and each tower's work to
TensorBoard.
"""

import argparse

# --8<-- [start:setup]
from importlib import resources

import keras
import numpy as np
import tensorflow as tf

import kerastower

towers = 4  # without GPUs: split the CPU into this many logical devices
epochs = 5
log_dir = "logs/digits"  # TensorBoard logs
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--towers", type=int, default=towers)
parser.add_argument("--epochs", type=int, default=epochs)
parser.add_argument("--log-dir", default=log_dir, help="TensorBoard logs")
args = parser.parse_args()
towers, epochs, log_dir = args.towers, args.epochs, args.log_dir

# --8<-- [start:towers]

gpus = tf.config.list_physical_devices("GPU")
if not gpus:
    kerastower.configure_logical_devices(towers)  # before the first model or tensor
towers = min(towers, len(gpus)) if gpus else towers
# --8<-- [end:towers]

# --8<-- [start:fit]

# The digits that `kerastower demo` trains on ship inside the package.
with (resources.files("kerastower") / "cli" / "digits.npz").open("rb") as file:
    digits = np.load(file)
    x = (digits["images"] / 16.0).astype("float32")[..., None]  # (1797, 8, 8, 1)
    y = digits["labels"].astype("int32")  # 0 to 9
x_train, y_train, x_test, y_test = x[:1437], y[:1437], x[1437:], y[1437:]

inputs = keras.Input((8, 8, 1))
h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
h = keras.layers.BatchNormalization()(h)  # synchronised over the towers
h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
h = keras.layers.MaxPooling2D()(h)
h = keras.layers.Flatten()(h)
h = keras.layers.Dense(64, activation="relu")(h)
outputs = keras.layers.Dense(10, activation="softmax")(h)
model = kerastower.TowerModel(inputs, outputs, towers=towers)
model.compile(
    optimizer=keras.optimizers.Adam(1e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)

monitor = kerastower.callbacks.TowerMonitor(log_dir)
model.fit(
    x_train,
    y_train,
    batch_size=30,  # the global batch: split over the towers
    epochs=epochs,
    validation_data=(x_test, y_test),
    callbacks=[monitor],  # then: tensorboard --logdir logs/digits
)
print(monitor.history[-1])  # the last epoch's values, also in TensorBoard
# --8<-- [end:fit]

loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
last = monitor.history[-1]
print(f"towers: {model.tower_devices}")
print(
    f"global batch {last['global_batch_size']} -> per tower "
    f"{last['per_tower_batch_size']}; examples per tower in the last epoch: "
    f"{last['tower_examples']}"
)
print(f"test accuracy: {accuracy:.3f}")
