"""A worker script written the natural way, run by the multi-worker tests.

It imports keras before kerastower, builds its layers before its first
`TowerModel` and never calls `kerastower.worker_strategy()`: the same script
trains on one machine, or on several with nothing but `TF_CONFIG` set (the
tests start it through ``kerastower launch``). The towers are the logical
CPUs that ``kerastower launch --towers`` asks for.

``python natural.py OUT FAMILY [K [S]]`` trains the model `FAMILY` ("dense",
"from_model", "subclassed", "own_step", "embedding", "masked", "spectral",
"contrastive", "two_outputs" or "even", dense layers on batches of a static
size) on this worker's
examples, accumulating `K` micro-batches per update when given, `S` steps per
execution, and writes the initial weights (chief), the final weights, the
history and the process's thread count after each epoch to ``OUT``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras

import kerastower
from kerastower.step import traced_towers

TRACED: list = []  # one entry per step whose towers were traced once
_run = traced_towers.run


def _counting_run(*args, **kwargs):
    TRACED.append(True)
    return _run(*args, **kwargs)


traced_towers.run = _counting_run

FEATURES = 5
BATCH = 4  # per worker; the global batch is the sum over workers
EPOCHS = 2


def worker_data(index: int, even: bool = False):
    """Worker ``i`` holds ``11 - i`` examples: uneven last batches, 3 steps;
    or, `even`, 8: 2 full batches, of a static size."""
    rng = np.random.default_rng(100 + index)
    n = 8 if even else 11 - index
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = (x @ np.arange(1, FEATURES + 1, dtype="float32")[:, None] / 5).astype("float32")
    return x, y


def layers(seed: int):
    keras.utils.set_random_seed(seed)
    return keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)


class Subclassed(kerastower.TowerModel):
    def __init__(self, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.out = layers(seed)

    def call(self, x):
        return self.out(self.hidden(x))


class OwnStep(kerastower.TowerModel):
    """A `train_step` of one's own, as keras.io's "customizing fit" writes it."""

    def train_step(self, data):
        x, y = data

        def loss_fn(x, y):
            return self.compute_loss(x, y, self(x, training=True))

        variables = self.trainable_variables
        grads, loss = self.tower_gradients(loss_fn, variables, x, y)
        self.optimizer.apply_gradients(zip(grads, variables))
        for metric in self.metrics:  # the loss tracker: `loss` is global
            metric.update_state(loss, sample_weight=tf.shape(x)[0])
        return {m.name: m.result() for m in self.metrics}


class Positions(keras.layers.Layer):
    """Adds a position table gathered once per batch (static rows)."""

    def build(self, shape):
        self.table = self.add_weight(shape=tuple(shape[1:]), name="table")

    def call(self, x):
        positions = tf.range(tf.shape(x)[1])
        return x + tf.gather(self.table, positions, axis=0)[None]


def embedding_graph(seed: int):
    """Token embeddings (rows that workers share) plus positions, and Adam."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,), dtype="int32")
    rows = Positions()(keras.layers.Embedding(6, 3)(inputs))
    return inputs, keras.layers.Dense(1)(keras.layers.Flatten()(rows))


def tokens(x):
    """Token ids for the "embedding" family: few ids, so workers share rows."""
    return (np.abs(x) * 3).astype("int32") % 6


def masked_graph(seed: int):
    """A per-step tagger: masked tokens, masked BatchNormalization, masked loss."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,), dtype="int32")
    rows = keras.layers.Embedding(7, 4, mask_zero=True)(inputs)
    rows = keras.layers.BatchNormalization()(rows)
    return inputs, keras.layers.Dense(1)(rows)


def spectral_graph(seed: int):
    """A spectrally normalised layer: a weight update in the forward pass."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.SpectralNormalization(
        keras.layers.Dense(8, activation="tanh")
    )(inputs)
    return inputs, keras.layers.Dense(1)(hidden)


def contrastive_graph(seed: int):
    """An encoder trained with `keras.losses.Circle` (`pair_agreement` on
    Keras 2), which compares every pair of examples of the global batch
    (``global_batch_loss``)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(4)(hidden)


def two_outputs_graph(seed: int):
    """Two heads, each with its own loss: Keras keeps a loss metric per output."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    heads = [
        keras.layers.Dense(k, name=name)(hidden) for k, name in ((1, "a"), (2, "b"))
    ]
    return inputs, heads


def pair_agreement(y_true, y_pred):
    """Per example: the squared distance between its cosine similarity to
    each example of the batch and whether they share a label. A loss of the
    whole batch for Keras 2, which has no `keras.losses.Circle`."""
    labels = tf.reshape(y_true, [-1])
    same = tf.cast(tf.equal(labels[:, None], labels[None, :]), y_pred.dtype)
    unit = tf.math.l2_normalize(y_pred, axis=1)
    similarity = tf.matmul(unit, unit, transpose_b=True)
    return tf.reduce_mean(tf.square(same - similarity), axis=1)


def compile_arguments(family: str) -> dict:
    """What both the workers and the one-device model compile with."""
    if family == "contrastive":
        circle = getattr(keras.losses, "Circle", None)
        return dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss=pair_agreement if circle is None else circle(gamma=4.0),
        )
    if family == "two_outputs":
        return dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss={"a": "mse", "b": "mae"},
            metrics={"b": ["mse"]},
        )
    if family == "own_step":  # its step updates the loss tracker only
        return dict(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return dict(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])


def family_data(family: str, index: int):
    """Worker ``index``'s examples for `family`.

    In the "masked" family worker ``i`` masks its first ``2 i`` steps (token
    0), so the workers hold different fractions of valid steps: weighting
    them by their examples would be wrong.
    """
    x, y = worker_data(index, even=family == "even")
    if family == "embedding":
        return tokens(x), y
    if family == "contrastive":
        return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")
    if family == "two_outputs":
        return x, (y, np.stack([x[:, 2], x[:, 3] * x[:, 4]], axis=1))
    if family == "masked":
        ids = tokens(x) + 1
        ids[:, : 2 * index] = 0
        return ids, x[:, :, None]
    return x, y


def build(family: str, seed: int):
    """The model, built before any strategy exists."""
    if family == "embedding":
        return kerastower.TowerModel(*embedding_graph(seed))
    if family == "masked":
        return kerastower.TowerModel(*masked_graph(seed))
    if family == "spectral":
        return kerastower.TowerModel(*spectral_graph(seed))
    if family == "contrastive":
        return kerastower.TowerModel(*contrastive_graph(seed), global_batch_loss=True)
    if family == "two_outputs":
        return kerastower.TowerModel(*two_outputs_graph(seed))
    if family == "subclassed":
        model = Subclassed(seed)
        model(np.zeros((1, FEATURES), "float32"))
        return model
    inputs = keras.Input((FEATURES,))
    hidden, out = layers(seed)
    outputs = out(hidden(inputs))
    if family == "from_model":
        return kerastower.TowerModel.from_model(keras.Model(inputs, outputs))
    if family == "own_step":
        return OwnStep(inputs, outputs)
    return kerastower.TowerModel(inputs, outputs)


class Threads(keras.callbacks.Callback):
    """The process's thread count after each epoch."""

    def __init__(self):
        super().__init__()
        self.counts = []

    def on_epoch_end(self, epoch, logs=None):
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("Threads:"))
        self.counts.append(int(line.split()[1]))


def main(out: str, family: str, accumulate: int = 1, steps: int = 1) -> None:
    index = kerastower.worker_index()
    x, y = family_data(family, index)
    # Different seeds on purpose: every worker starts from the chief's weights.
    model = build(family, seed=index)
    if index == 0:
        np.savez(os.path.join(out, "initial.npz"), *model.get_weights())
    model.compile(**compile_arguments(family), steps_per_execution=steps)
    threads = Threads()
    callbacks = [threads]
    if accumulate > 1:
        callbacks.append(kerastower.callbacks.GradientAccumulation(accumulate))
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    np.savez(os.path.join(out, f"worker{index}.npz"), *model.get_weights())
    report = dict(
        history.history,
        towers=model.num_towers,
        workers=model.num_workers,
        threads=threads.counts,
        # kerastower's own: whether the towers trained on replicas.
        replicas=model._tower_step.replicas is not None,
        traced_once=bool(TRACED),
    )
    with open(os.path.join(out, f"history{index}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(k) for k in sys.argv[3:]))
