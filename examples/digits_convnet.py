"""A small convnet on scikit-learn's digits, trained over several towers.

The digits ship with scikit-learn, so this runs offline:

    python examples/digits_convnet.py --towers 4 --epochs 5 --log-dir logs/digits
    tensorboard --logdir logs/digits

With GPUs the towers are the GPUs; without, the CPU is split into `--towers`
logical devices.
"""

import argparse

import tensorflow as tf

import kerastower


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--towers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=30, help="global batch")
    parser.add_argument("--log-dir", default=None, help="TensorBoard logs")
    return parser.parse_args(argv)


def load_digits():
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]  # (1797, 8, 8, 1)
    y = digits.target.astype("int32")
    return (x[:1437], y[:1437]), (x[1437:], y[1437:])


def build_convnet(keras):
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)  # synchronised over the towers
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return inputs, outputs


def main(argv=None):
    args = parse_args(argv)
    # --8<-- [start:towers]
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        kerastower.configure_logical_devices(args.towers)  # before any TF work
    towers = min(args.towers, len(gpus)) if gpus else args.towers
    # --8<-- [end:towers]
    import keras

    (x, y), (x_test, y_test) = load_digits()
    # --8<-- [start:fit]
    inputs, outputs = build_convnet(keras)
    model = kerastower.TowerModel(inputs, outputs, towers=towers)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    monitor = kerastower.callbacks.TowerMonitor(args.log_dir)
    model.fit(
        x,
        y,
        batch_size=args.batch_size,  # global: split over the towers
        epochs=args.epochs,
        validation_data=(x_test, y_test),
        callbacks=[monitor],
    )
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


if __name__ == "__main__":
    main()
