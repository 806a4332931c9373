"""One machine with several GPUs: every GPU is a tower, fed by a tf.data pipeline.

    python examples/one_machine.py --epochs 3

Without a GPU the CPU is split into 4 logical devices that stand in for GPUs,
so the same script runs (slowly) on a laptop or in CI. It ends by checking
that the saved and reloaded model predicts what the trained one does.
"""

import argparse

# --8<-- [start:setup]
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import kerastower

if not tf.config.list_physical_devices("GPU"):
    kerastower.configure_logical_devices(4)  # 4 logical CPUs stand in for 4 GPUs

rng = np.random.default_rng(0)
x = rng.normal(size=(2000, 32)).astype("float32")
y = np.argmax(x[:, :5] + 0.5 * x[:, 5:10], axis=1)
train = tf.data.Dataset.from_tensor_slices((x[:1600], y[:1600]))  # unbatched
validation = tf.data.Dataset.from_tensor_slices((x[1600:], y[1600:]))
epochs = 3
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=epochs)
epochs = parser.parse_args().epochs
# --8<-- [start:script]

inputs = keras.Input((32,))
hidden = keras.layers.Dense(128, activation="relu")(inputs)
hidden = keras.layers.BatchNormalization()(hidden)  # statistics of the global batch
outputs = keras.layers.Dense(5, activation="softmax")(hidden)
model = kerastower.TowerModel(inputs, outputs)  # towers=None: every GPU
model.compile(
    optimizer="adam",
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)
print(f"{model.num_towers} towers: {model.tower_devices}")

per_tower = 32  # what fits on one GPU
batch_size = kerastower.global_batch_size(per_tower, model)  # per_tower x towers
train_batches = kerastower.batch_for_towers(
    train.shuffle(1600, seed=0), per_tower, model
).prefetch(tf.data.AUTOTUNE)
model.fit(
    train_batches,
    epochs=epochs,
    validation_data=validation.batch(batch_size),
    callbacks=[kerastower.callbacks.TowerMonitor()],  # examples per second
)

path = os.path.join(tempfile.mkdtemp(), "model.keras")
model.save(path)  # variables are ordinary variables: no strategy scope
restored = keras.models.load_model(path)  # a TowerModel again (import kerastower)
predictions = restored.predict(x[1600:], batch_size=batch_size)
# --8<-- [end:script]
same = np.allclose(predictions, model.predict(x[1600:], verbose=0), atol=1e-6)
print(f"restored {type(restored).__name__} predicts the same: {same}")
if not same:
    raise SystemExit("the restored model predicts differently")
