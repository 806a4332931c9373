"""Towers equal one device on the models people train most (issue 13).

Sparse gradients (embeddings gathered per example and tables gathered once
per batch) with optimizers that are not linear in the gradient, masked and
``ignore_class`` sequence losses whose towers hold different numbers of valid
tokens, every reduction Keras has, and layers that used to break on towers
with no example (batches smaller than the number of towers).
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only
from oracle import (
    assert_close,
    assert_same_history,
    assert_same_weights,
    fit_and_compare,
    padded_sequences,
    token_position_model,
    twin,
)

import kerastower
from kerastower import _keras_compat
from kerastower.reduce.gradients import sum_gradients

RNG = np.random.default_rng(0)


TOKENS = RNG.integers(0, 5, size=(22, 6))  # few tokens: many duplicates
TARGETS = RNG.normal(size=(22, 1)).astype("float32")


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.AdamW(0.01),
        lambda: keras.optimizers.RMSprop(0.01),
        lambda: keras.optimizers.Adagrad(0.1),
        lambda: keras.optimizers.Nadam(0.01),
        pytest.param(
            lambda: keras.optimizers.Lion(0.01),
            marks=pytest.mark.skipif(
                not hasattr(keras.optimizers, "Lion"), reason="Keras 2.12 has no Lion"
            ),
        ),
        lambda: keras.optimizers.Adam(0.01, clipnorm=0.1),
        lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.1),
    ],
    ids=[
        "sgd-momentum",
        "adam",
        "adamw",
        "rmsprop",
        "adagrad",
        "nadam",
        "lion",
        "adam-clipnorm",
        "adam-global-clipnorm",
    ],
)
def test_sparse_gradients_with_any_optimizer(optimizer):
    fit_and_compare(
        token_position_model,
        TOKENS,
        TARGETS,
        lambda: dict(optimizer=optimizer(), loss="mse"),
        towers=4,
        batch_size=7,
        epochs=2,
    )


@pytest.mark.parametrize("clipnorm", [None, 0.1], ids=["adam", "adam-clipnorm"])
def test_sparse_gradients_run_eagerly(clipnorm):
    # Eager tensors all have static shapes: the position table (fixed rows)
    # and the token rows (one per example) are told apart by tracing.
    fit_and_compare(
        token_position_model,
        TOKENS,
        TARGETS,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01, clipnorm=clipnorm),
            loss="mse",
            run_eagerly=True,
        ),
        towers=4,
        batch_size=7,
        epochs=2,
    )


def test_combined_sparse_gradients_stay_sparse():
    def slices(rows, indices):
        return tf.IndexedSlices(
            tf.constant(rows, tf.float32), tf.constant(indices), tf.constant([5, 2])
        )

    # Rows of gathers over the examples: one device has every row, in order.
    @tf.function(input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([None, 2])])
    def per_example(a, b):
        first = tf.IndexedSlices(a, tf.range(tf.shape(a)[0]), tf.constant([5, 2]))
        second = tf.IndexedSlices(b, tf.range(tf.shape(b)[0]), tf.constant([5, 2]))
        combined = sum_gradients([first, second])
        assert isinstance(combined, tf.IndexedSlices)
        return combined.values, combined.indices

    values, indices = per_example(tf.ones((2, 2)), 2 * tf.ones((1, 2)))
    assert indices.numpy().tolist() == [0, 1, 0]
    assert_close(values, [[1, 1], [1, 1], [2, 2]])
    # A table gathered once per batch: the towers' rows merge by index.
    merged = sum_gradients(
        [slices([[1, 1], [2, 2]], [3, 1]), slices([[5, 5], [7, 7]], [3, 1])]
    )
    assert isinstance(merged, tf.IndexedSlices)
    assert merged.indices.numpy().tolist() == [3, 1]
    assert_close(merged.values, [[6, 6], [9, 9]])


def tagger(mask_zero=True, recurrent=True):
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((7,), dtype="int32")
        h = keras.layers.Embedding(20, 8, mask_zero=mask_zero)(inputs)
        if recurrent:
            h = keras.layers.LSTM(8, return_sequences=True)(h)
        elif mask_zero:  # per-step layers that keep the mask
            h = keras.layers.Dense(8, activation="tanh")(h)
        else:
            h = keras.layers.Conv1D(8, 3, padding="same")(h)
        return keras.Model(inputs, keras.layers.Dense(3)(h))

    return build


SEQUENCES, TAGS = padded_sequences(RNG)


@pytest.mark.parametrize("recurrent", [True, False], ids=["lstm", "dense"])
def test_masked_sequence_loss(recurrent):
    fit_and_compare(
        tagger(recurrent=recurrent),
        SEQUENCES,
        TAGS,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        ),
        batch_size=7,
        epochs=2,
    )


def test_ignore_class_per_step_tagger():
    labels = np.where(SEQUENCES == 0, -1, TAGS)
    fit_and_compare(
        tagger(mask_zero=False, recurrent=False),
        SEQUENCES,
        labels,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=-1
            ),
        ),
        batch_size=7,
        epochs=2,
    )


@pytest.mark.parametrize(
    "reduction",
    [
        "sum_over_batch_size",
        pytest.param("mean", marks=keras3_only),
        "sum",
        pytest.param("mean_with_sample_weight", marks=keras3_only),
    ],
)
def test_every_reduction_with_mask_and_per_step_sample_weights(reduction):
    weights = RNG.uniform(0.2, 2.0, size=TAGS.shape).astype("float32")
    fit_and_compare(
        tagger(),
        SEQUENCES,
        TAGS,
        lambda: dict(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=reduction
            ),
        ),
        sample_weight=weights,
        batch_size=7,
        epochs=2,
    )


def test_multi_output_mixing_masked_and_plain_losses():
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((7,), dtype="int32")
        h = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
        h = keras.layers.LSTM(8, return_sequences=True)(h)
        tags = keras.layers.Dense(3, name="tags")(h)
        score = keras.layers.Dense(1, name="score")(
            keras.layers.GlobalAveragePooling1D()(h)
        )
        return keras.Model(inputs, {"tags": tags, "score": score})

    fit_and_compare(
        build,
        SEQUENCES,
        {"tags": TAGS, "score": RNG.normal(size=(22, 1)).astype("float32")},
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss={
                "tags": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                "score": keras.losses.MeanSquaredError(reduction="sum"),
            },
            loss_weights={"tags": 1.0, "score": 0.5},
        ),
        batch_size=7,
        epochs=2,
    )


def conv_model(layer):
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8, 8, 3))
        h = layer()(inputs)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        return keras.Model(inputs, keras.layers.Dense(5)(h))

    return build


LAYERS = {
    "conv2d": lambda: keras.layers.Conv2D(4, 3),
    "depthwise": lambda: keras.layers.DepthwiseConv2D(3),
    "separable": lambda: keras.layers.SeparableConv2D(4, 3),
    "transposed": lambda: keras.layers.Conv2DTranspose(4, 3),
    "max-pool": lambda: keras.layers.MaxPooling2D(2),
}


@pytest.mark.parametrize("mode", ["graph", "eager", "jit"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_batches_smaller_than_the_towers(layer, mode):
    # 22 examples in batches of 5 on 3 towers: the last batch of 2 leaves a
    # tower without an example, which crashed oneDNN convolutions.
    x = RNG.normal(size=(22, 8, 8, 3)).astype("float32")
    y = RNG.integers(0, 5, size=(22,))
    fit_and_compare(
        conv_model(LAYERS[layer]),
        x,
        y,
        lambda: dict(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            run_eagerly=mode == "eager",
            jit_compile=mode == "jit",
        ),
        batch_size=5,
        epochs=1,
    )


@keras3_only
def test_a_changed_keras_reduction_is_an_error_not_a_model(monkeypatch):
    from keras.src.losses import loss as loss_module

    real = loss_module.reduce_weighted_values

    def changed(values, sample_weight=None, mask=None, reduction="sum", dtype=None):
        value = real(values, sample_weight, mask, reduction, dtype)
        return value if reduction == "sum" else value * 2.0

    from kerastower._keras_compat.keras3 import losses

    monkeypatch.setattr(loss_module, "reduce_weighted_values", changed)
    losses.check_reductions.cache_clear()
    try:
        x, y = padded_sequences(RNG, 6)
        model = kerastower.TowerModel.from_model(tagger()(), towers=2)
        model.compile(
            optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy()
        )
        with pytest.raises(
            _keras_compat.KerasCompatibilityError, match="reduce_weighted_values"
        ):
            model.fit(x, y, batch_size=6, verbose=0)
    finally:
        monkeypatch.undo()
        losses.check_reductions.cache_clear()


@keras3_only
def test_missing_keras_hook_is_an_error(monkeypatch):
    from keras.src.losses import loss as loss_module

    from kerastower._keras_compat.keras3 import losses

    monkeypatch.delattr(loss_module, "apply_mask")
    with pytest.raises(_keras_compat.KerasCompatibilityError, match="apply_mask"):
        losses._loss_module()


class PenaltyLayer(keras.layers.Layer):
    """Adds ``reduce(x ** 2)`` over the batch with `add_loss`."""

    def __init__(self, reduce="mean", **kwargs):
        super().__init__(**kwargs)
        self.reduce = reduce
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        squares = tf.reduce_sum(tf.square(x), axis=-1)
        reduce = tf.reduce_mean if self.reduce == "mean" else tf.reduce_sum
        self.add_loss(0.1 * reduce(squares))
        return self.dense(x)


def penalty_model(reduce):
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,))
        return keras.Model(inputs, PenaltyLayer(reduce)(inputs))

    return build


def test_add_loss_batch_mean_is_exact():
    x = RNG.normal(size=(22, 4)).astype("float32")
    y = RNG.normal(size=(22, 2)).astype("float32")
    fit_and_compare(
        penalty_model("mean"),
        x,
        y,
        lambda: dict(optimizer=keras.optimizers.SGD(0.05), loss="mse"),
        batch_size=7,
        epochs=2,
    )


def test_add_loss_batch_sum_is_weighted_as_a_mean():
    # Keras gives add_loss terms no reduction: towers weight each tower's term
    # by n_i / B, which is right for a batch mean and, for a batch sum, gives
    # sum_i (n_i / B) * S_i instead of one device's sum_i S_i (docs: Concepts).
    x = RNG.normal(size=(10, 4)).astype("float32")
    plain, towered = twin(penalty_model("sum"), 3)
    for model in (plain, towered):
        model.compile(optimizer="sgd")
    squares = 0.1 * np.sum(x**2, axis=-1)
    sizes = kerastower.split_sizes(10, 3)
    shards = np.split(squares, np.cumsum(sizes)[:-1])
    rule = sum(size / 10 * shard.sum() for size, shard in zip(sizes, shards))
    one_device = plain.evaluate(x, batch_size=10, verbose=0)
    assert_close(one_device, squares.sum())
    assert_close(towered.evaluate(x, batch_size=10, verbose=0), rule)
    assert abs(rule - squares.sum()) > 0.1 * squares.sum()  # really differs


def depthwise_net():
    """MobileNet's building blocks: strided, depthwise and separable convolutions
    with `BatchNormalization` and ReLU6."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 3))
    h = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)
    for layer in (
        keras.layers.DepthwiseConv2D(3, padding="same"),
        keras.layers.SeparableConv2D(8, 3, padding="same"),
    ):
        h = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(h))
        h = layer(h)
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.BatchNormalization()(h))
    return keras.Model(inputs, keras.layers.Dense(4)(h))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_depthwise_batch_norm_in_float64(float64, optimizer):
    # In float64, rounding (1e-16) cannot hide a difference in the
    # computation: towers must equal one device to 1e-12 (measured: 1e-15).
    # Batches of 5 on 3 towers (2, 2, 1), and a last batch of 1 example.
    x = RNG.normal(size=(11, 12, 12, 3))
    y = RNG.integers(0, 4, size=(11,))
    plain, towered = twin(depthwise_net, 3)
    histories = []
    for model in (plain, towered):
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        fit = model.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0)
        histories.append(fit.history)
    assert all(w.dtype == "float64" for w in towered.weights)
    assert_same_history(*histories, rtol=1e-12, atol=1e-12)
    assert_same_weights(plain, towered, rtol=1e-12, atol=1e-12)
