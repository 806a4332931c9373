"""One machine with several GPUs: every GPU is a tower, fed by a tf.data pipeline.

    python examples/one_machine.py --epochs 3 --log-dir logs/one_machine

Without a GPU the CPU is split into 4 logical devices that stand in for GPUs,
so the same script runs (slowly) on a laptop or in CI.
"""

import argparse
import os
import tempfile

import tensorflow as tf

import kerastower

if not tf.config.list_physical_devices("GPU"):
    kerastower.configure_logical_devices(4)  # stand-ins for 4 GPUs

import keras  # noqa: E402
import numpy as np  # noqa: E402


def datasets(examples=2000, features=32, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, features)).astype("float32")
    y = np.argmax(x[:, :classes] + 0.5 * x[:, classes : 2 * classes], axis=1)
    train = tf.data.Dataset.from_tensor_slices((x[:1600], y[:1600]))
    validation = tf.data.Dataset.from_tensor_slices((x[1600:], y[1600:]))
    return train, validation, x[1600:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--per-tower-batch-size", type=int, default=32)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    train, validation, x_val = datasets()

    # --8<-- [start:model]
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
    # --8<-- [end:model]

    # --8<-- [start:fit]
    per_tower = args.per_tower_batch_size
    batch_size = kerastower.global_batch_size(per_tower, model)  # per_tower x towers
    train_batches = kerastower.batch_for_towers(
        train.shuffle(1600, seed=0), per_tower, model
    ).prefetch(tf.data.AUTOTUNE)
    model.fit(
        train_batches,
        epochs=args.epochs,
        validation_data=validation.batch(batch_size),
        callbacks=[kerastower.callbacks.TowerMonitor(args.log_dir)],
    )
    # --8<-- [end:fit]

    # --8<-- [start:save]
    path = os.path.join(tempfile.mkdtemp(), "model.keras")
    model.save(path)  # variables are ordinary variables: no strategy scope
    restored = keras.models.load_model(path)  # a TowerModel again (import kerastower)
    predictions = restored.predict(x_val, batch_size=batch_size, verbose=0)
    # --8<-- [end:save]
    same = np.allclose(predictions, model.predict(x_val, verbose=0), atol=1e-6)
    print(f"restored {type(restored).__name__} predicts the same: {same}")
    if not same:
        raise SystemExit("the restored model predicts differently")


if __name__ == "__main__":
    main()
