"""The measured process of `bench.traffic`: one setup, a few marked steps.

``python -m bench.traffic --worker MODEL SETUP N BATCH`` runs `worker` on ``N``
logical CPUs: it builds the model (`MODELS`, `EMBEDDING_MODELS`) in the setup
(`SETUPS`), fits steps 0 to ``max(MEASURED_STEPS)`` with a marker
(`bench.traffic_log.MARKER`) before and after each, and prints the facts that
the parent needs to read its log as one JSON line.
"""

from __future__ import annotations

import json
import os

from bench.traffic_log import MARKER, short_device

MEASURED_STEPS = (1, 2)

# name: (input features, hidden units, hidden layers, classes)
MODELS = {
    "mlp": (1024, 1024, 3, 10),
    "tiny": (64, 256, 2, 10),
}
# name: (vocabulary, embedding width, tokens per example, classes): a table
# whose gradient is sparse rows (`tf.IndexedSlices`), a small dense head.
EMBEDDING_MODELS = {"embedding": (20_000, 64, 32, 10)}
INDEX_BYTES = 8  # the rows' indices travel as int64
SETUPS = {
    "tower": "kerastower.TowerModel.from_model(model, towers=N)",
    "tower_replicas": "kerastower.TowerModel.from_model(model, towers=N, "
    "replicate_variables=True): per-tower replicas, ring all-reduce",
    "tower_replicas_buckets": "tower_replicas with "
    "all_reduce=kerastower.AllReduceOptions(bucket_mb=2): an all-reduce per "
    "bucket of at most 2 MB of gradients",
    "tower_replicas_accumulate": "tower_replicas with "
    "kerastower.callbacks.GradientAccumulation(2, 'carry'): measured step 1 "
    "applies a window, step 2 only accumulates",
    "tower_replicas_own_step": "tower_replicas with a train_step of its own "
    "(self.tower_gradients, then self.optimizer.apply_gradients): each step "
    "also copies the weights to the replicas through the ring",
    "mirrored_ring": "tf.distribute.MirroredStrategy(devices): default "
    "cross-device ops, CollectiveAllReduce with the RING implementation on CPUs",
    "mirrored_one": "tf.distribute.MirroredStrategy(devices, "
    "cross_device_ops=tf.distribute.ReductionToOneDevice())",
    "mirrored_hier": "tf.distribute.MirroredStrategy(devices, "
    "cross_device_ops=tf.distribute.HierarchicalCopyAllReduce())",
}


# -- The measured process -------------------------------------------------------


def _build(name: str):
    import keras

    if name in EMBEDDING_MODELS:
        vocabulary, width, length, classes = EMBEDDING_MODELS[name]
        keras.utils.set_random_seed(0)
        inputs = keras.Input((length,), dtype="int32")
        hidden = keras.layers.Embedding(vocabulary, width)(inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(hidden)
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
        return keras.Model(inputs, keras.layers.Dense(classes)(hidden), name=name)
    features, units, layers, classes = MODELS[name]
    keras.utils.set_random_seed(0)
    inputs = keras.Input((features,))
    hidden = inputs
    for _ in range(layers):
        hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(classes)(hidden), name=name)


def worker(model_name: str, setup: str, devices: int, batch_size: int) -> None:
    """Fits a few steps with markers around each; prints facts as JSON."""
    import kerastower

    kerastower.configure_logical_devices(devices)

    import keras
    import numpy as np
    import tensorflow as tf

    from bench.report import machine_info

    names = [d.name for d in tf.config.list_logical_devices("CPU")[:devices]]

    def compiled(model):
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    class OwnStep(kerastower.TowerModel):
        def train_step(self, data):
            x, y = data

            def loss_fn(x, y):
                return self.compute_loss(x, y, self(x, training=True))

            variables = self.trainable_variables
            grads, loss = self.tower_gradients(loss_fn, variables, x, y)
            self.optimizer.apply_gradients(zip(grads, variables))
            return {"loss": loss}

    callbacks = []
    if setup.startswith("tower"):
        towered = OwnStep if setup.endswith("_own_step") else kerastower.TowerModel
        model = compiled(
            towered.from_model(
                _build(model_name),
                towers=devices,
                replicate_variables=setup.startswith("tower_replicas"),
                all_reduce=kerastower.AllReduceOptions(
                    bucket_mb=2 if setup.endswith("_buckets") else 25
                ),
            )
        )
        if setup.endswith("_accumulate"):
            callbacks.append(kerastower.callbacks.GradientAccumulation(2, "carry"))
    else:
        cross_device_ops = {
            "mirrored_ring": None,
            "mirrored_one": tf.distribute.ReductionToOneDevice(),
            "mirrored_hier": tf.distribute.HierarchicalCopyAllReduce(),
        }[setup]
        strategy = tf.distribute.MirroredStrategy(
            names, cross_device_ops=cross_device_ops
        )
        with strategy.scope():
            model = compiled(_build(model_name))

    class Markers(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            os.write(2, f"\n{MARKER} begin {batch}\n".encode())

        def on_train_batch_end(self, batch, logs=None):
            os.write(2, f"\n{MARKER} end {batch}\n".encode())

    examples = (max(MEASURED_STEPS) + 1) * batch_size
    rng = np.random.default_rng(0)
    sparse_shapes, row_bytes = [], 0
    if model_name in EMBEDDING_MODELS:
        vocabulary, width, length, classes = EMBEDDING_MODELS[model_name]
        x = rng.integers(0, vocabulary, size=(examples, length)).astype("int32")
        sparse_shapes = [[vocabulary, width]]
        row_bytes = batch_size * length * (4 * width + INDEX_BYTES)
    else:
        features, _, _, classes = MODELS[model_name]
        x = rng.normal(size=(examples, features)).astype("float32")
    y = rng.integers(0, classes, size=(examples,)).astype("int32")
    model.fit(
        x,
        y,
        batch_size=batch_size,
        shuffle=False,
        verbose=0,
        callbacks=[*callbacks, Markers()],
    )
    facts = {
        "devices": [short_device(name) for name in names],
        "variable_shapes": [list(v.shape) for v in model.trainable_variables],
        "variable_dtypes": sorted({str(v.dtype) for v in model.trainable_variables}),
        "sparse_shapes": sparse_shapes,
        "row_bytes": row_bytes,
        "machine": machine_info(),
    }
    print(json.dumps(facts))
