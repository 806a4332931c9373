"""Every tower's optimizer update: traced once, applied on every tower."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import assert_same_weights, mlp, regression_data, twin

from kerastower import _keras_compat


def optimizers_traced(monkeypatch):
    """The optimizers whose update a step traces, in order: the model's and
    its clones."""
    traced = []
    original = keras.optimizers.Optimizer.apply_gradients

    def recorded(self, grads_and_vars, *args, **kwargs):
        traced.append(self)
        return original(self, grads_and_vars, *args, **kwargs)

    monkeypatch.setattr(keras.optimizers.Optimizer, "apply_gradients", recorded)
    return traced


def fit_twin(optimizer, towers=4):
    x, y = regression_data(n=22)
    plain, towered = twin(mlp, towers, replicate_variables=True)
    for model in (plain, towered):
        model.compile(optimizer=optimizer(), loss="mse")
        model.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
    return plain, towered


def assert_every_tower_in_sync(model):
    """Each replica and each clone's whole state equal tower 0's, bit for bit."""
    replicas = model._tower_step.replicas
    primaries = replicas.replica_variables(0)
    for tower in range(1, model.num_towers):
        for primary, copy in zip(primaries, replicas.replica_variables(tower)):
            np.testing.assert_array_equal(copy.numpy(), primary.numpy())
        clone = replicas._clones[tower - 1]
        state = list(model.optimizer.variables)
        assert len(clone.variables) == len(state)
        for primary, copy in zip(state, clone.variables):
            np.testing.assert_array_equal(copy.numpy(), primary.numpy())


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    ],
    ids=["adam", "nesterov"],
)
def test_the_models_update_serves_every_tower(optimizer, monkeypatch, float64):
    traced = optimizers_traced(monkeypatch)
    plain, towered = fit_twin(optimizer)
    # Every trace of the step traced the model's optimizer's update, once,
    # and no clone's.
    ours = [o for o in traced if o is not plain.optimizer]
    assert ours == [towered.optimizer]
    assert_same_weights(plain, towered)
    assert_every_tower_in_sync(towered)


class ScaledRate(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule that reads a variable of its own."""

    def __init__(self):
        self.scale = tf.Variable(0.05, dtype="float64", trainable=False)

    def __call__(self, step):
        return self.scale * 1.0


def test_an_update_reading_other_variables_is_traced_per_tower(monkeypatch, float64):
    traced = optimizers_traced(monkeypatch)
    plain, towered = fit_twin(lambda: keras.optimizers.SGD(ScaledRate()))
    clones = towered._tower_step.replicas._clones
    # The schedule's variable is captured: the model's function would read
    # it for every tower, correctly, but a captured variable that is not
    # known could be one that the update writes.
    ours = {id(o) for o in traced if o is not plain.optimizer}
    assert ours == {id(o) for o in [towered.optimizer, *clones]}
    assert_same_weights(plain, towered)
    assert_every_tower_in_sync(towered)


def test_two_towers_share_the_models_update(monkeypatch, float64):
    traced = optimizers_traced(monkeypatch)
    plain, towered = fit_twin(lambda: keras.optimizers.Adam(0.01), towers=2)
    assert [o for o in traced if o is not plain.optimizer] == [towered.optimizer]
    assert_same_weights(plain, towered)
    assert_every_tower_in_sync(towered)


def test_a_call_needs_every_input():
    variable = tf.Variable(1.0)
    function = tf.function(lambda x: variable.assign_add(x)).get_concrete_function(
        tf.TensorSpec([], tf.float32)
    )
    with pytest.raises(ValueError, match=r"1 inputs, flat\. Received: 2 inputs"):
        _keras_compat.call_with_captures(function, [1.0, 2.0], {})
    other = tf.Variable(5.0)
    _keras_compat.call_with_captures(
        function, [tf.constant(2.0)], {id(variable.handle): other.handle}
    )
    assert (float(variable.numpy()), float(other.numpy())) == (1.0, 7.0)
