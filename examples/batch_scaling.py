"""Scale the learning rate with the global batch, with warmup, on four towers.

    python examples/batch_scaling.py --epochs 3

A learning rate of 0.01 was tuned for a global batch of 16. Four towers of 16
examples each make a global batch of 64, so `BatchScaling` raises the rate
linearly to 0.01 * 64 / 16 = 0.04 over the first 2 epochs. The example trains
the same model three times from the same weights:

- four towers, arrays and ``batch_size=kerastower.global_batch_size(...)``;
- four towers, a `tf.data` pipeline batched by `kerastower.batch_for_towers`;
- one device, with the warmup formula of the docs applied by hand per batch.

It checks that the learning rate logged at the end of each epoch is the
closed-form value (``lr_target`` once the warmup is over) and that the three
runs end with the same weights.
"""

import argparse

# --8<-- [start:setup]
import keras
import numpy as np
import tensorflow as tf

import kerastower

kerastower.configure_logical_devices(4)  # without GPUs: 4 logical CPUs as towers

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")  # 8 global batches of 64
y = np.tanh(x[:, :1] - x[:, 1:2]).astype("float32")


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


epochs = 3
# --8<-- [end:setup]
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=int, default=epochs)
epochs = parser.parse_args().epochs
BASE_LR, BASE_BATCH, WARMUP_EPOCHS = 0.01, 16, 2

# --8<-- [start:model]

model = kerastower.TowerModel.from_model(build(), towers=4)
model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
batch_size = kerastower.global_batch_size(16, model)  # 16 per tower x 4 = 64
# --8<-- [end:model]

# --8<-- [start:scaling]

scaling = kerastower.callbacks.BatchScaling(
    per_tower_batch_size=16,
    base_learning_rate=0.01,  # tuned for a global batch of 16
    base_batch_size=16,
    rule="linear",  # lr_target = 0.01 * 64 / 16 = 0.04
    warmup_epochs=2,  # 0.01 -> 0.04 over the first 2 epochs
)
# --8<-- [end:scaling]

# --8<-- [start:fit]

history = model.fit(
    x,
    y,
    batch_size=batch_size,  # the global batch
    epochs=epochs,
    shuffle=False,
    callbacks=[scaling],  # put History, CSVLogger, TensorBoard after it
)
print(history.history["learning_rate"])  # at the end of each epoch
# --8<-- [end:fit]
arrays, arrays_history = model, history

# --8<-- [start:dataset]

model = kerastower.TowerModel.from_model(build(), towers=4)
model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
dataset = tf.data.Dataset.from_tensor_slices((x, y))  # unbatched: one example each
train = kerastower.batch_for_towers(dataset, 16, model, drop_remainder=True)
history = model.fit(train, epochs=epochs, callbacks=[scaling])  # no batch_size
# --8<-- [end:dataset]
piped, piped_history = model, history


def warmup_lr(epoch, batch, steps, target):
    """The rate at the start of batch `batch` of epoch `epoch` (both 0-based)."""
    epochs_done = epoch + (batch + 1) / steps
    return BASE_LR + (target - BASE_LR) * min(epochs_done / WARMUP_EPOCHS, 1.0)


class HandWarmup(keras.callbacks.Callback):
    """Sets the one-device rate from the closed form, for the reference run."""

    def __init__(self, steps, target):
        super().__init__()
        self.steps, self.target, self.epoch = steps, target, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        lr = warmup_lr(self.epoch, batch, self.steps, self.target)
        self.model.optimizer.learning_rate = lr


steps = len(x) // batch_size
target = BASE_LR * batch_size / BASE_BATCH
reference = build()
reference.compile(optimizer=keras.optimizers.SGD(momentum=0.9), loss="mse")
reference.fit(
    x,
    y,
    batch_size=batch_size,
    epochs=epochs,
    shuffle=False,
    callbacks=[HandWarmup(steps, target)],
    verbose=0,
)

expected = [warmup_lr(k, steps - 1, steps, target) for k in range(epochs)]
print(f"global batch {batch_size} on {arrays.num_towers} towers, lr_target {target}")
print("learning rate logged per epoch:", arrays_history.history["learning_rate"])
print("closed form at each epoch's end: ", expected)
for logged in (
    arrays_history.history["learning_rate"],
    piped_history.history["learning_rate"],
):
    if not np.allclose(logged, expected, rtol=1e-6, atol=0):
        raise SystemExit("the logged learning rates are not the closed form")
if epochs >= WARMUP_EPOCHS:
    done = arrays_history.history["learning_rate"][WARMUP_EPOCHS - 1]
    print(f"learning rate at the end of warmup: {done:.6g} = lr_target {target:.6g}")
    if abs(done - target) > 1e-7:
        raise SystemExit("the warmup did not end at lr_target")

difference = max(
    float(np.max(np.abs(a - b)))
    for other in (piped, reference)
    for a, b in zip(arrays.get_weights(), other.get_weights())
)
print(f"max |w - w_other| over arrays, tf.data and one device = {difference:.1e}")
if difference > 1e-5:
    raise SystemExit("the runs did not end with the same weights")
