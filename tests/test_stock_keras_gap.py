"""Stock Keras under MirroredStrategy fails on uneven batches; TowerModel does not.

These tests pin the gap that kerastower exists to close (Keras 3.15, TF 2.21):
a global batch that does not divide by the replica count crashes `fit`, and an
uneven last batch silently trains a different model. If a future Keras fixes
either, its test skips with that reason, while the TowerModel half still runs.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import max_weight_diff, mlp, plain_fit_data, regression_data

import kerastower


def train_three_ways(examples, batch_size, replicas, epochs=2):
    """Trains one device, MirroredStrategy and TowerModel from the same weights."""
    x, y = regression_data(n=examples)
    reference = mlp()
    strategy = tf.distribute.MirroredStrategy(
        [f"/device:CPU:{i}" for i in range(replicas)]
    )
    with strategy.scope():
        mirrored = mlp()
    towers = kerastower.TowerModel.from_model(mlp(), towers=replicas)
    for model in (mirrored, towers):
        model.set_weights(reference.get_weights())
    for model in (reference, mirrored, towers):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    fit = dict(batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    xs, ys, reference_fit = plain_fit_data(x, y, fit)
    reference.fit(xs, ys, **reference_fit)
    towers.fit(x, y, **fit)
    try:
        mirrored.fit(x, y, **fit)
    except tf.errors.InvalidArgumentError as error:
        return reference, towers, error
    return reference, towers, mirrored


def test_batch_not_divisible_by_replicas_crashes_stock_keras():
    reference, towers, mirrored = train_three_ways(30, 10, 3)
    assert max_weight_diff(reference, towers) < 1e-6
    if isinstance(mirrored, keras.Model):
        pytest.skip(
            f"Keras {keras.__version__} now trains a global batch of 10 on 3 "
            "replicas: the crash this test documents is fixed"
        )
    assert "AddN" in str(mirrored)


def test_uneven_last_batch_silently_trains_a_different_model():
    # 21 examples in batches of 8: the last batch of 5 is split 3 + 2.
    reference, towers, mirrored = train_three_ways(21, 8, 2)
    assert max_weight_diff(reference, towers) < 1e-6
    if not isinstance(mirrored, keras.Model):
        pytest.fail(f"MirroredStrategy crashed instead: {mirrored}")
    gap = max_weight_diff(reference, mirrored)
    if gap < 1e-5:
        pytest.skip(
            f"Keras {keras.__version__} now weights an uneven last batch "
            f"correctly (max weight difference {gap:.1e}): the gap is fixed"
        )
    assert gap > 1e-3


def test_even_batches_agree_everywhere():
    # The control: with every batch split evenly, stock Keras is exact too.
    reference, towers, mirrored = train_three_ways(24, 8, 2, epochs=1)
    assert max_weight_diff(reference, towers) < 1e-6
    assert max_weight_diff(reference, mirrored) < 1e-6
    np.testing.assert_allclose(
        reference.predict(np.ones((2, 5), "float32"), verbose=0),
        towers.predict(np.ones((2, 5), "float32"), verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )
