"""What the replica tests share: fitting twins, and replicas in sync."""

import keras
import numpy as np
from oracle import (
    assert_same_history,
    assert_same_weights,
    plain_fit_data,
)


def compile_both(plain, towered, optimizer, loss="mse", metrics=("mae",)):
    for model in (plain, towered):
        model.compile(
            optimizer=keras.optimizers.get(keras.optimizers.serialize(optimizer)),
            loss=loss,
            metrics=list(metrics),
        )


def fit_pair(plain, towered, x, y, callbacks=lambda: [], **kwargs):
    kwargs.setdefault("verbose", 0)
    kwargs.setdefault("shuffle", False)
    return [
        model.fit(xs, ys, callbacks=callbacks(), **fit).history
        for model, (xs, ys, fit) in (
            (plain, plain_fit_data(x, y, kwargs)),
            (towered, (x, y, kwargs)),
        )
    ]


def assert_trains_as_one_device(plain, towered, x, y, **kwargs):
    """Fits both; same history and weights, and the replicas in sync."""
    ha, hb = fit_pair(plain, towered, x, y, **kwargs)
    assert_same_history(ha, hb)
    assert_same_weights(plain, towered)
    assert_replicas_in_sync(towered)


def assert_replicas_in_sync(model):
    """Every tower's replica equals the model's variable bit for bit."""
    replicas = model._tower_step.replicas
    assert replicas is not None and replicas.built
    primaries = replicas.replica_variables(0)
    for tower in range(1, model.num_towers):
        copies = replicas.replica_variables(tower)
        assert len(copies) == len(primaries)
        for primary, copy in zip(primaries, copies):
            assert copy.value.device.endswith(model.tower_devices[tower][-5:])
            np.testing.assert_array_equal(copy.numpy(), primary.numpy())
        clone = replicas._clones[tower - 1]
        # Not the learning rate: the clones copy it before each step, so a
        # rate that a callback changed after the last step has not reached
        # them yet.
        assert int(clone.iterations.numpy()) == int(model.optimizer.iterations.numpy())


def batch_norm_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(6)(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    outputs = keras.layers.Dense(1)(keras.layers.Activation("relu")(hidden))
    return keras.Model(inputs, outputs)


def embedding_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(50, 4)(inputs)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def spy(monkeypatch, owner, name):
    """Counts the calls of ``owner.name`` (traces, for a traced step)."""
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        counted.count += 1
        return original(*args, **kwargs)

    counted.count = 0
    monkeypatch.setattr(owner, name, counted)
    return counted
