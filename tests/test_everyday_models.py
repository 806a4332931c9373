"""Towers equal one device on everyday keras.io models beyond the core cases.

String inputs and text preprocessing, confusion-matrix metrics (AUC,
precision, recall, F1), a Transformer block, a masked bidirectional GRU,
hashing and encoding layers, mixed precision, `validation_freq`; and a clear
error for stateful RNNs, which cannot be split.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import (
    assert_close,
    assert_same_history,
    assert_same_weights,
    fit_and_compare,
    padded_sequences,
    twin,
)

import kerastower

RNG = np.random.default_rng(3)
WORDS = ["red", "green", "blue", "cat", "dog"]


def sentences(n=22):
    return tf.constant(
        [" ".join(RNG.choice(WORDS, size=RNG.integers(1, 6))) for _ in range(n)]
    )


def binary_metrics():
    # Named, so that the two models' metrics get the same history keys.
    return [
        "accuracy",
        keras.metrics.AUC(name="auc"),
        keras.metrics.Precision(name="precision"),
        keras.metrics.Recall(name="recall"),
    ]


def test_string_lookup_with_adam():
    vocabulary = ["a", "b", "c", "d"]
    x = tf.constant([[RNG.choice([*vocabulary, "unknown"])] for _ in range(22)])
    y = RNG.normal(size=(22, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((1,), dtype="string")
        h = keras.layers.StringLookup(vocabulary=vocabulary)(inputs)
        h = keras.layers.Flatten()(keras.layers.Embedding(6, 4)(h))
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    fit_and_compare(
        build,
        x,
        y,
        lambda: dict(optimizer=keras.optimizers.Adam(0.01), loss="mse"),
        batch_size=5,
        epochs=2,
    )


def test_text_vectorization_with_masked_embedding_and_auc():
    x = sentences()
    y = RNG.integers(0, 2, size=(22, 1)).astype("float32")
    adapted = keras.layers.TextVectorization(max_tokens=10, output_sequence_length=6)
    adapted.adapt(x)
    vocabulary = adapted.get_vocabulary()[2:]  # without padding and OOV

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((), dtype="string")
        h = keras.layers.TextVectorization(
            max_tokens=10, output_sequence_length=6, vocabulary=vocabulary
        )(inputs)
        h = keras.layers.Embedding(10, 4, mask_zero=True)(h)
        h = keras.layers.GlobalAveragePooling1D()(h)
        return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(h))

    fit_and_compare(
        build,
        x,
        y,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.01),
            loss="binary_crossentropy",
            metrics=binary_metrics(),
        ),
        batch_size=5,
        epochs=2,
    )


def test_confusion_matrix_metrics():
    x = RNG.normal(size=(22, 4)).astype("float32")
    y = RNG.integers(0, 2, size=(22, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))

    fit_and_compare(
        build,
        x,
        y,
        lambda: dict(
            optimizer="sgd",
            loss="binary_crossentropy",
            metrics=[
                *binary_metrics(),
                keras.metrics.F1Score(threshold=0.5, name="f1"),
                keras.metrics.PrecisionAtRecall(0.5, name="p_at_r"),
                keras.metrics.BinaryIoU(name="iou"),
            ],
        ),
        batch_size=5,
        epochs=2,
    )


def transformer_block(use_bias):
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,), dtype="int32")
        h = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
        attended = keras.layers.MultiHeadAttention(2, 4, use_bias=use_bias)(h, h)
        h = keras.layers.LayerNormalization()(h + attended)
        h = keras.layers.GlobalAveragePooling1D()(h)
        return keras.Model(inputs, keras.layers.Dense(2)(h))

    return build


# The attention's key bias shifts every score of a query equally, so softmax
# cancels it and its true gradient is 0: what remains is rounding (5e-6 after
# two Adam epochs, measured, on a bias of 3e-6), which Adam scales up to steps
# of the learning rate. SGD keeps it at rounding size; Adam runs without it.
@pytest.mark.parametrize(
    "optimizer, use_bias",
    [
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9), True),
        (lambda: keras.optimizers.Adam(0.01), False),
    ],
    ids=["sgd-momentum", "adam-no-bias"],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_transformer_block(optimizer, use_bias, dtype, request):
    if dtype == "float64":
        request.getfixturevalue("float64")
    x = RNG.integers(1, 20, size=(22, 6))
    x[:, 4:] = 0
    y = RNG.integers(0, 2, size=(22,))
    fit_and_compare(
        transformer_block(use_bias),
        x,
        y,
        lambda: dict(
            optimizer=optimizer(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        ),
        batch_size=5,
        epochs=2,
        # float32: the attention's output bias grows to |b| = 4.5, where one
        # rounding of its sum is ~5e-7 on every element, near-zero ones too
        # (measured 1.1e-6 on an element of 1.7e-3). float64 shows that it is
        # rounding: the same model equals one device to 1.6e-15.
        atol=1e-12 if dtype == "float64" else 5e-6,
        rtol=1e-12 if dtype == "float64" else 1e-5,
    )


def test_masked_bidirectional_gru():
    x, y = padded_sequences(np.random.default_rng(0))

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((7,), dtype="int32")
        h = keras.layers.Embedding(20, 8, mask_zero=True)(inputs)
        h = keras.layers.Bidirectional(keras.layers.GRU(4, return_sequences=True))(h)
        return keras.Model(inputs, keras.layers.Dense(3)(h))

    fit_and_compare(
        build,
        x,
        y,
        lambda: dict(
            optimizer=keras.optimizers.RMSprop(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        ),
        batch_size=5,
        epochs=2,
    )


def test_hashing_and_encoding_layers():
    x = RNG.integers(0, 50, size=(22, 3))
    y = RNG.normal(size=(22, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((3,), dtype="int64")
        hashed = keras.layers.Hashing(8)(inputs)
        hashed = keras.layers.CategoryEncoding(8, output_mode="multi_hot")(hashed)
        binned = keras.layers.Discretization(bin_boundaries=[10, 20, 30])(inputs)
        binned = keras.layers.CategoryEncoding(4, output_mode="count")(binned)
        h = keras.layers.Concatenate()([hashed, binned])
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    fit_and_compare(
        build, x, y, lambda: dict(optimizer="adam", loss="mse"), batch_size=5, epochs=2
    )


def test_mixed_precision():
    x = RNG.normal(size=(22, 4)).astype("float32")
    y = RNG.integers(0, 3, size=(22,))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:

        def build():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((4,))
            h = keras.layers.Dense(8, activation="relu")(inputs)
            return keras.Model(inputs, keras.layers.Dense(3, dtype="float32")(h))

        plain, towered = twin(build, 3)
        histories = []
        for model in (plain, towered):
            model.compile(
                optimizer=keras.optimizers.SGD(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
            history = model.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0)
            histories.append(history.history)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(towered.optimizer, keras.optimizers.LossScaleOptimizer)
    # A float16 weight gradient is rounded once per tower instead of once per
    # batch: at most 2**-11 of |g| <= 1, times lr 0.01, over 10 steps is 5e-5
    # (measured: 3.6e-6 on the first kernel).
    assert_same_weights(plain, towered, atol=5e-5)
    assert_same_history(*histories, rtol=1e-3)  # float16 logits: 2**-11


def test_validation_freq():
    x, y = RNG.normal(size=(22, 4)), RNG.normal(size=(22, 1))

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(1)(inputs))

    fit_and_compare(
        build,
        x.astype("float32"),
        y.astype("float32"),
        lambda: dict(optimizer="sgd", loss="mse"),
        batch_size=5,
        epochs=4,
        validation_data=(x[:7], y[:7]),
        validation_freq=2,
    )


def test_augmentation_layers_train_and_infer_as_on_one_device():
    # Random layers draw their own numbers per tower (see Concepts): training
    # runs, and with the same weights inference is exact.
    x = RNG.normal(size=(22, 12, 12, 3)).astype("float32")
    y = RNG.integers(0, 3, size=(22,))

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((12, 12, 3))
        h = keras.layers.RandomFlip("horizontal")(inputs)
        h = keras.layers.RandomRotation(0.1)(h)
        h = keras.layers.RandomZoom(0.1)(h)
        h = keras.layers.Dropout(0.3)(keras.layers.Conv2D(4, 3)(h))
        h = keras.layers.GlobalAveragePooling2D()(h)
        return keras.Model(inputs, keras.layers.Dense(3)(h))

    plain, towered = twin(build, 3)
    for model in (plain, towered):
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        history = model.fit(x, y, batch_size=5, epochs=2, verbose=0).history
        assert np.all(np.isfinite(history["loss"]))
    towered.set_weights(plain.get_weights())
    expected = plain.evaluate(x, y, batch_size=5, verbose=0)
    assert_close(towered.evaluate(x, y, batch_size=5, verbose=0), expected)
    assert_close(
        towered.predict(x, batch_size=5, verbose=0),
        plain.predict(x, batch_size=5, verbose=0),
    )


def test_transfer_learning_freeze_then_fine_tune():
    x = RNG.normal(size=(22, 8, 8, 3)).astype("float32")
    y = RNG.integers(0, 3, size=(22,))

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8, 8, 3))
        h = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3)(inputs))
        pooled = keras.layers.GlobalAveragePooling2D()(h)
        base = keras.Model(inputs, pooled, name="base")
        base.trainable = False
        inputs = keras.Input((8, 8, 3))
        return keras.Model(inputs, keras.layers.Dense(3)(base(inputs, training=False)))

    # SGD in the fine-tuning: the conv bias before a training-mode
    # BatchNormalization has a true gradient of 0 (the layer subtracts the
    # mean), and Adam would scale its rounding up to steps of the learning
    # rate (measured: plain 4.5e-4, towers 1.5e-4; SGD: 5e-9 and 2e-9).
    plain, towered = twin(build, 3)
    histories = []
    for model in (plain, towered):
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss)
        frozen = model.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0)
        model.get_layer("base").trainable = True
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=loss)
        tuned = model.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0)
        tuned = {f"tuned_{key}": value for key, value in tuned.history.items()}
        histories.append({**frozen.history, **tuned})
    assert_same_history(*histories)
    assert_same_weights(plain, towered)


class Hits(keras.metrics.Metric):
    """The keras.io guide's custom metric: how many argmax predictions hit."""

    def __init__(self, name="hits", **kwargs):
        super().__init__(name=name, **kwargs)
        self.hits = self.add_variable(shape=(), initializer="zeros", name="hits")

    def update_state(self, y_true, y_pred, sample_weight=None):
        predicted = keras.ops.argmax(y_pred, axis=1)
        hit = keras.ops.equal(keras.ops.reshape(y_true, (-1,)), predicted)
        self.hits.assign_add(keras.ops.sum(keras.ops.cast(hit, "float32")))

    def result(self):
        return self.hits

    def reset_state(self):
        self.hits.assign(0.0)


def test_dict_inputs_shared_layer_custom_metric_and_loss_from_a_dataset():
    n = 23
    a, b = (RNG.normal(size=(n, 4)).astype("float32") for _ in range(2))
    y = RNG.integers(0, 3, size=(n, 1))
    sample_weight = RNG.uniform(0.5, 2, size=(n,)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices(({"a": a, "b": b}, y, sample_weight))

    def build():
        keras.utils.set_random_seed(0)
        first, second = keras.Input((4,), name="a"), keras.Input((4,), name="b")
        shared = keras.layers.Dense(5, activation="tanh")
        h = keras.layers.Concatenate()([shared(first), shared(second)])
        return keras.Model({"a": first, "b": second}, keras.layers.Dense(3)(h))

    def loss(y_true, y_pred):
        return keras.losses.sparse_categorical_crossentropy(
            y_true, y_pred, from_logits=True
        )

    plain, towered = twin(build, 3)
    histories = []
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
            loss=loss,
            metrics=[Hits()],
            weighted_metrics=["accuracy"],
        )
        halve = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)
        batches = data.batch(5)
        history = model.fit(
            batches, epochs=3, validation_data=batches, callbacks=[halve], verbose=0
        )
        histories.append(history.history)
    assert_same_history(*histories)
    assert_same_weights(plain, towered)


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_a_stateful_rnn_is_refused_with_a_clear_error(method):
    inputs = keras.Input((5, 2), batch_size=6)
    outputs = keras.layers.Dense(1)(keras.layers.LSTM(4, stateful=True)(inputs))
    model = kerastower.TowerModel(inputs, outputs, towers=3)
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((12, 5, 2), "float32"), np.zeros((12, 1), "float32")
    args = (x,) if method == "predict" else (x, y)
    with pytest.raises(ValueError, match="is stateful.*towers=3 with stateful=True"):
        getattr(model, method)(*args, batch_size=6, verbose=0)


def test_a_stateful_rnn_trains_on_one_tower_as_on_one_device(monkeypatch):
    # Row i of a batch starts from the state row i of the batch before left:
    # reordering each batch's rows another way would train another model.
    monkeypatch.setattr("oracle.REORDER", False)
    x = RNG.normal(size=(24, 5, 2)).astype("float32")
    y = RNG.normal(size=(24, 1)).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5, 2), batch_size=6)
        h = keras.layers.LSTM(4, stateful=True)(inputs)
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    fit_and_compare(
        build,
        x,
        y,
        lambda: dict(optimizer="sgd", loss="mse"),
        towers=1,
        batch_size=6,
        epochs=2,
    )


@pytest.mark.parametrize(
    "strategy",
    [
        lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    ],
    ids=["mirrored", "one-device"],
)
def test_building_inside_a_strategy_scope_is_refused(strategy):
    # The keras.io multi-GPU guide builds in `strategy.scope()`; a TowerModel
    # built there crashed in its first step with an AddN shape error.
    inputs = keras.Input((3,))
    with strategy().scope():
        with pytest.raises(ValueError, match=r"outside `strategy.scope\(\)`"):
            kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs), towers=2)
