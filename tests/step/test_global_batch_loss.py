"""Losses that compare the examples of a batch: ``global_batch_loss=True``.

A contrastive loss scores each example against every other example of the
batch; on towers, each shard's loss saw only its own examples: 8.8e-2 off one
device (stock `MirroredStrategy`: 2.4e-1). With ``global_batch_loss=True``
every tower computes the loss of the whole batch from the gathered
predictions, and the gradients flow back to the tower that made each one.
"""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only
from oracle import (
    fit_and_compare,
    padded_sequences,
    twin,
)

import kerastower

RNG = np.random.default_rng(5)
X = RNG.normal(size=(23, 6)).astype("float32")
LABELS = RNG.integers(0, 3, size=(23, 1)).astype("float32")


def in_batch_contrastive(y_true, y_pred):
    """Supervised contrastive loss, SimCLR- and CLIP-style: each example's
    targets are the other examples of the batch with its label."""
    z = y_pred / tf.norm(y_pred, axis=1, keepdims=True)
    logits = tf.matmul(z, tf.transpose(z)) / 0.5
    same = tf.cast(tf.equal(y_true, tf.transpose(y_true)), "float32")
    targets = same / tf.reduce_sum(same, axis=1, keepdims=True)
    return keras.losses.categorical_crossentropy(targets, logits, from_logits=True)


def encoder_graph():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(4)(h)


def encoder():
    return keras.Model(*encoder_graph())


def contrastive_compile():
    return dict(optimizer=keras.optimizers.Adam(0.02), loss=in_batch_contrastive)


@pytest.mark.parametrize("replicate", [False, True], ids=["shared", "replicas"])
@pytest.mark.parametrize("batch_size", [5, 7])
def test_an_in_batch_contrastive_loss_trains_as_one_device(batch_size, replicate):
    # Batches of 5 end with 3 examples; of 7, with 2, fewer than the 3
    # towers (run whole on the first).
    fit_and_compare(
        encoder,
        X,
        LABELS,
        contrastive_compile,
        towers=3,
        batch_size=batch_size,
        epochs=2,
        tower_kwargs=dict(global_batch_loss=True, replicate_variables=replicate),
    )


@keras3_only
def test_without_the_option_the_first_step_refuses_the_loss():
    # Each shard's loss is not the batch's: the first step finds it
    # (`kerastower.step.coupled_loss`) and names the option.
    plain, towered = twin(encoder, 3)
    towered.compile(**contrastive_compile())
    with pytest.raises(ValueError, match="global_batch_loss=True"):
        towered.fit(X, LABELS, batch_size=6, epochs=2, verbose=0)


def test_sample_weights_are_gathered_with_the_predictions():
    weights = RNG.uniform(0.2, 2.0, size=(23,)).astype("float32")
    fit_and_compare(
        encoder,
        X,
        LABELS,
        contrastive_compile,
        towers=3,
        batch_size=6,
        epochs=2,
        sample_weight=weights,
        tower_kwargs=dict(global_batch_loss=True),
    )


def segmenter():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    return keras.Model(inputs, keras.layers.Dense(3, activation="sigmoid")(inputs))


MASKS = (RNG.uniform(size=(23, 3)) < 0.4).astype("float32")


@pytest.mark.parametrize("loss", ["dice", keras.losses.Tversky(), keras.losses.Dice()])
def test_keras_losses_over_the_whole_batch_need_the_option(loss):
    model = kerastower.TowerModel.from_model(segmenter(), towers=2)
    model.compile(optimizer="sgd", loss=loss)
    with pytest.raises(ValueError, match=r"`global_batch_loss=True`"):
        model.fit(X, MASKS, batch_size=6, verbose=0)


def test_dice_and_circle_train_as_one_device_with_the_option():
    fit_and_compare(
        segmenter,
        X,
        MASKS,
        lambda: dict(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.Dice()),
        towers=3,
        batch_size=6,
        epochs=2,
        tower_kwargs=dict(global_batch_loss=True),
    )
    fit_and_compare(
        encoder,
        X,
        LABELS[:, 0].astype("int32"),
        lambda: dict(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.Circle()),
        towers=3,
        batch_size=6,
        epochs=2,
        tower_kwargs=dict(global_batch_loss=True),
    )


def test_per_axis_dice_splits_without_the_option():
    # Dice over each example's own elements is a per-example loss.
    fit_and_compare(
        segmenter,
        X,
        MASKS,
        lambda: dict(optimizer="sgd", loss=keras.losses.Dice(axis=1)),
        towers=3,
        batch_size=6,
        epochs=2,
    )


def test_masked_sequence_losses_keep_their_masks_through_the_gather():
    x, y = padded_sequences(np.random.default_rng(3))

    def tagger():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((7,), dtype="int32")
        h = keras.layers.Embedding(20, 6, mask_zero=True)(inputs)
        return keras.Model(inputs, keras.layers.Dense(3)(h))

    fit_and_compare(
        tagger,
        x,
        y,
        lambda: dict(
            optimizer=keras.optimizers.Adam(0.02),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        ),
        towers=3,
        batch_size=5,
        epochs=2,
        tower_kwargs=dict(global_batch_loss=True),
    )


def test_the_option_round_trips_through_the_config():
    model = kerastower.TowerModel.from_model(
        encoder(), towers=2, global_batch_loss=True
    )
    clone = kerastower.TowerModel.from_config(model.get_config())
    assert clone.global_batch_loss is True


class TracksLoss:
    """Keras's ``test_metric_update_in_compute_loss``: a metric updated inside
    `compute_loss`, with a batch scalar."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.custom = keras.metrics.Mean(name="custom")

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        self.custom.update_state(loss * 4)
        return loss


class PlainTracksLoss(TracksLoss, keras.Model):
    pass


class TowerTracksLoss(TracksLoss, kerastower.TowerModel):
    pass


def test_a_metric_of_the_loss_updated_in_compute_loss_is_one_devices():
    # With the option every tower computes the whole batch's loss; the
    # towers' updates count with their loss's weights (1 and 0s).
    histories = []
    for cls, kwargs in (
        (PlainTracksLoss, {}),
        (TowerTracksLoss, dict(towers=3, global_batch_loss=True)),
    ):
        model = cls(*encoder_graph(), **kwargs)
        model.compile(optimizer="sgd", loss="mse")
        histories.append(
            model.fit(X, X[:, :4], batch_size=5, epochs=2, shuffle=False, verbose=0)
        )
    plain, towered = (h.history for h in histories)
    np.testing.assert_allclose(towered["custom"], plain["custom"], rtol=1e-5)
    np.testing.assert_allclose(towered["loss"], plain["loss"], rtol=1e-5)


def regularized_encoder():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = keras.layers.Dense(
        8,
        activation="tanh",
        kernel_regularizer=keras.regularizers.L2(0.01),
        activity_regularizer=keras.regularizers.L1(0.05),
    )(inputs)
    return keras.Model(inputs, keras.layers.Dense(4)(h))


def test_regularization_counts_every_shard_with_the_option():
    # The compiled loss is the whole batch's, counted once; the activity
    # regularizer (a batch mean) is each shard's, weighted by its share as
    # without the option, and the kernel regularizer is counted once.
    fit_and_compare(
        regularized_encoder,
        X,
        LABELS,
        contrastive_compile,
        towers=3,
        batch_size=7,
        epochs=2,
        tower_kwargs=dict(global_batch_loss=True),
    )
