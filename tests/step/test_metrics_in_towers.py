"""Metrics a model updates itself, inside its towers, report one device's value.

A `keras.metrics.Mean` of a batch scalar (the loss, tracked in
`compute_loss`) counts each tower by its share of the batch; per-example
updates and sums add up over the towers (`kerastower._keras_compat.metrics`).
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only_until_ported
from oracle import assert_close, assert_same_history, padded_sequences

import kerastower


class Tracks:
    """Updates three metrics in `compute_loss`: a `Mean` of the loss, a
    per-token `SparseCategoricalAccuracy` and a `Sum` of the predictions."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracked = keras.metrics.Mean(name="tracked")
        self.error = keras.metrics.SparseCategoricalAccuracy(name="error")
        self.total = keras.metrics.Sum(name="total")

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kw):
        loss = super().compute_loss(x, y, y_pred, sample_weight, **kw)
        self.tracked.update_state(loss * 4)
        self.error.update_state(y, y_pred)
        self.total.update_state(tf.reduce_sum(y_pred))
        return loss


class PlainTracks(Tracks, keras.Model):
    pass


class TowerTracks(Tracks, kerastower.TowerModel):
    pass


def tagger():
    """Per-token tags of padded sequences: a masked loss (`mask_zero`)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(20, 6, mask_zero=True)(inputs)
    return inputs, keras.layers.Dense(3)(h)


X, Y = padded_sequences(np.random.default_rng(3), n=23)
WEIGHTS = np.random.default_rng(4).uniform(0.2, 2.0, size=(23, 7)).astype("float32")


def train_and_evaluate(cls, run_eagerly, **kwargs):
    model = cls(*tagger(), **kwargs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.02),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=run_eagerly,
    )
    history = model.fit(
        X, Y, sample_weight=WEIGHTS, batch_size=5, epochs=2, shuffle=False, verbose=0
    ).history
    logs = model.evaluate(X, Y, batch_size=7, verbose=0, return_dict=True)
    return history, logs


@keras3_only_until_ported("a `Sum` updated in `compute_loss` counts tower 0 only")
@pytest.mark.parametrize("replicate", [False, True], ids=["shared", "replicas"])
@pytest.mark.parametrize("run_eagerly", [False, True])
def test_metrics_updated_in_compute_loss_are_one_devices(run_eagerly, replicate):
    # Masked tokens, sample weights and towers of 2 and 1 examples (the last
    # batch of 3): before, the `Mean` of the loss was the towers' unweighted
    # mean (0.36% off on an unmasked model).
    plain = train_and_evaluate(PlainTracks, run_eagerly)
    towered = train_and_evaluate(
        TowerTracks, run_eagerly, towers=3, replicate_variables=replicate
    )
    assert_same_history(towered[0], plain[0])
    assert sorted(towered[1]) == sorted(plain[1])
    for key in plain[1]:
        assert_close(towered[1][key], plain[1][key], err_msg=key)


def test_the_mean_class_is_left_as_it_was():
    before = dict(vars(keras.metrics.Mean))
    model = TowerTracks(*tagger(), towers=2)
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.evaluate(X[:5], Y[:5], verbose=0)
    assert dict(vars(keras.metrics.Mean)) == before
    mean = keras.metrics.Mean()
    mean.update_state(3.0)
    mean.update_state(5.0)
    assert float(mean.result()) == 4.0


class LossInStep:
    """keras.io's custom step, tracking the loss inside the towers' `loss_fn`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracked = keras.metrics.Mean(name="tracked")

    @property
    def metrics(self):
        return [self.tracked]

    def train_step(self, data):
        x, y = data

        def loss_fn(x, y):
            loss = tf.reduce_mean(tf.square(y - self(x, training=True)))
            self.tracked.update_state(loss)
            return loss

        variables = self.trainable_variables
        grads, _ = self.gradients(loss_fn, variables, x, y)
        self.optimizer.apply_gradients(zip(grads, variables))
        return {"tracked": self.tracked.result()}


class PlainLossInStep(LossInStep, keras.Model):
    def gradients(self, loss_fn, variables, x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(x, y)
        return tape.gradient(loss, variables), loss


class TowerLossInStep(LossInStep, kerastower.TowerModel):
    def gradients(self, loss_fn, variables, x, y):
        return self.tower_gradients(loss_fn, variables, x, y)


def test_a_mean_updated_in_a_custom_steps_loss_fn_is_one_devices():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 5)).astype("float32")
    y = rng.normal(size=(23, 1)).astype("float32")
    histories = []
    for cls, kwargs in ((PlainLossInStep, {}), (TowerLossInStep, dict(towers=3))):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,))
        model = cls(inputs, keras.layers.Dense(1)(inputs), **kwargs)
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        histories.append(
            model.fit(x, y, batch_size=7, epochs=2, shuffle=False, verbose=0).history
        )
    assert_same_history(*histories)
