"""Multi-GPU training in 5 minutes: from one device to every GPU of a machine.

    python examples/five_minutes.py

Trains a small classifier on one device, then the same model as a
`TowerModel` on every GPU (without a GPU: on 4 logical CPUs), saves and
loads it, and checks with `compare_with_one_device` that the towers train
the model one device trains. The guide "Multi-GPU training in 5 minutes"
includes its sections.
"""

# --8<-- [start:setup]
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import kerastower

# Without a GPU, split the CPU into 4 logical devices that stand in for GPUs.
# (Before the first model or tensor; with GPUs, every GPU is a tower.)
if not tf.config.list_physical_devices("GPU"):
    kerastower.configure_logical_devices(4)

# 1,200 examples of 20 features, 3 classes: 1,000 to train on, 200 to test.
rng = np.random.default_rng(0)
x = rng.normal(size=(1200, 20)).astype("float32")
y = np.argmax(x[:, :3] + 0.5 * x[:, 3:6], axis=1)
x_train, y_train, x_test, y_test = x[:1000], y[:1000], x[1000:], y[1000:]


def build_model():
    """A plain Keras model, as for one device, from the same initial weights."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    return keras.Model(inputs, outputs)


# --8<-- [end:setup]
# --8<-- [start:one_device]
model = build_model()
model.compile(
    optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
)
model.fit(x_train, y_train, batch_size=64, epochs=3)
model.evaluate(x_test, y_test)
# --8<-- [end:one_device]
# --8<-- [start:towers]
model = kerastower.TowerModel.from_model(build_model())  # every GPU
print(f"{model.num_towers} towers: {model.tower_devices}")
model.compile(
    optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
)
batch_size = kerastower.global_batch_size(16, model)  # 16 per tower: 64 on 4
model.fit(x_train, y_train, batch_size=batch_size, epochs=3)
loss, accuracy = model.evaluate(x_test, y_test, batch_size=batch_size)
probabilities = model.predict(x_test, batch_size=batch_size)  # in input order

folder = tempfile.mkdtemp()
model.save(os.path.join(folder, "classifier.keras"))  # no strategy scope to save
restored = keras.models.load_model(os.path.join(folder, "classifier.keras"))
model.save_weights(os.path.join(folder, "classifier.weights.h5"))
plain = build_model()  # back to one device: a plain keras.Model
plain.load_weights(os.path.join(folder, "classifier.weights.h5"))
# --8<-- [end:towers]
same = np.allclose(restored.predict(x_test, verbose=0), probabilities, atol=1e-6)
same = same and np.allclose(plain.predict(x_test, verbose=0), probabilities, atol=1e-6)
print(f"restored TowerModel and plain keras.Model predict the same: {same}")
if not same:
    raise SystemExit("the restored or plain model predicts differently")


# --8<-- [start:check]
def build(towers):
    """A new compiled model: on `towers`, or for 1 the plain one-device model."""
    model = build_model()
    if towers != 1:
        model = kerastower.TowerModel.from_model(model, towers=towers)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


report = kerastower.testing.compare_with_one_device(
    build, x_train, y_train, batch_size=30, epochs=2
)
print(report)  # float64: the towers' weights against one device's
# --8<-- [end:check]
if not report.same:
    raise SystemExit("the towers did not train one device's model")
