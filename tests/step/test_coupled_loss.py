"""A compiled loss that couples the examples of a batch is found at the first step.

The keras.io supervised-contrastive loss (a `Loss` with a `__call__` of its
own, in-batch pairs) compiled on towers without ``global_batch_loss`` would
train another model than one device (8.8e-2 apart after an epoch, measured):
the first step refuses it before any update, naming the option; with the
option the towers are one device's model. Separable losses train as before,
and the check runs once.
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only

import kerastower
from kerastower.testing import compare_with_one_device

pytestmark = keras3_only  # Keras 2 is not checked (kerastower.step.coupled_loss)

TOWERS = 3


def npairs_loss(y_true, y_pred):
    """TensorFlow Addons' `npairs_loss`, as the keras.io example uses it."""
    y_true = tf.cast(y_true, y_pred.dtype)[:, None]
    y_true = tf.cast(tf.equal(y_true, tf.transpose(y_true)), y_pred.dtype)
    y_true /= tf.reduce_sum(y_true, 1, keepdims=True)
    loss = tf.nn.softmax_cross_entropy_with_logits(logits=y_pred, labels=y_true)
    return tf.reduce_mean(loss)


class SupervisedContrastiveLoss(keras.losses.Loss):
    """keras.io's "Supervised Contrastive Learning" loss, as written there."""

    def __init__(self, temperature=1, name=None):
        super().__init__(name=name)
        self.temperature = temperature

    def __call__(self, labels, feature_vectors, sample_weight=None):
        normalized = keras.utils.normalize(feature_vectors, axis=1, order=2)
        logits = keras.ops.divide(
            keras.ops.matmul(normalized, keras.ops.transpose(normalized)),
            self.temperature,
        )
        return npairs_loss(keras.ops.squeeze(labels), logits)


def batch_scaled_mse(y_true, y_pred):
    # One value per example, divided by a statistic of the whole batch.
    return keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1) / (
        keras.ops.mean(keras.ops.square(y_true))
    )


def builder(loss, global_batch_loss=False, outputs=8, **tower_kwargs):
    def build(towers):
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(16, activation="tanh")(inputs)
        model = kerastower.TowerModel(
            inputs,
            keras.layers.Dense(outputs)(hidden),
            towers=towers,
            global_batch_loss=global_batch_loss,
            **tower_kwargs,
        )
        model.compile(optimizer="adam", loss=loss())
        return model

    return build


def data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, rng.integers(0, 4, size=(n, 1))


def contrastive(**kwargs):
    return builder(lambda: SupervisedContrastiveLoss(temperature=0.1), **kwargs)


@pytest.mark.parametrize("replicas", [False, True])
def test_a_contrastive_loss_is_refused_before_the_first_update(replicas):
    x, y = data()
    model = contrastive(replicate_variables=replicas)(TOWERS)
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"global_batch_loss=True") as error:
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert "supervised_contrastive_loss" in str(error.value)
    assert "Received: global_batch_loss=False" in str(error.value)
    for now, then in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, then)


def test_train_on_batch_is_refused_too():
    x, y = data()
    model = contrastive()(TOWERS)
    with pytest.raises(ValueError, match=r"compares the examples of a batch"):
        model.train_on_batch(x[:16], y[:16])


def test_a_per_example_loss_scaled_by_the_batch_is_refused():
    x, _ = data()
    model = builder(lambda: batch_scaled_mse, outputs=1)(TOWERS)
    with pytest.raises(ValueError, match=r"batch_scaled_mse.*global_batch_loss=True"):
        model.fit(x, x[:, :1], batch_size=12, epochs=1, verbose=0)


def test_with_global_batch_loss_the_contrastive_loss_is_one_devices():
    x, y = data()
    report = compare_with_one_device(
        contrastive(global_batch_loss=True), x, y, towers=TOWERS, batch_size=16
    )
    assert report.same, report
    assert report.difference < 1e-12, report


@pytest.mark.parametrize(
    "loss",
    [
        lambda: "mse",
        lambda: keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0
        ),
        lambda: keras.losses.Huber(),
    ],
    ids=["mse", "ignore_class", "huber"],
)
def test_separable_losses_train_and_are_checked_once(loss):
    x, y = data()
    model = builder(loss)(TOWERS)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    check = model._tower_step.coupled
    assert check.applies()
    assert bool(check._done.numpy())
