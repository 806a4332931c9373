"""Layers that update their weights in the forward pass train as on one device.

`SpectralNormalization` assigns ``vector_u`` and ``kernel / sigma`` at every
training call. Towers that each ran it normalised the kernel once per tower:
2 towers were 0.033 off one device's kernel and 0.15 off its ``vector_u``
after one step at learning rate 0.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf
from keras_family import (
    KERAS_2,
    keras,
    keras2_only,
    keras3_only,
    keras3_only_until_ported,
    spectral_normalization,
)
from oracle import assert_same_history, assert_same_weights, plain_fit_data, twin

import kerastower
from kerastower import _keras_compat
from kerastower.callbacks import GradientAccumulation

# Keras 2 has no scope that holds a tower's assignments: such a model is
# refused there (`test_keras_2_refuses_a_forward_pass_that_assigns_a_weight`).
assigning_layers = keras3_only_until_ported("a forward pass that assigns a weight")
running_sums = keras3_only_until_ported("a forward pass that assigns a weight")

RNG = np.random.default_rng(11)
X = RNG.normal(size=(22, 6, 6, 2)).astype("float32")
Y = RNG.normal(size=(22, 1)).astype("float32")


def spectral_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.SpectralNormalization(keras.layers.Conv2D(3, 3))(inputs)
    h = keras.layers.Flatten()(h)
    h = keras.layers.SpectralNormalization(
        keras.layers.Dense(5, activation="tanh"), power_iterations=2
    )(h)
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def fit(model, batch_size=10, oracle=False, **kwargs):
    """Fits on X, Y; the `oracle` (one device) on `plain_fit_data`'s."""
    # Batches of 10, 10 and 2: the last is smaller than 3 towers, so it
    # runs whole on the first tower.
    kwargs |= dict(batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    x, y, kwargs = plain_fit_data(X, Y, kwargs) if oracle else (X, Y, kwargs)
    return model.fit(x, y, **kwargs).history


@spectral_normalization
@pytest.mark.parametrize("towers", [2, 3])
@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_spectral_normalization_updates_once_per_step(towers, run_eagerly):
    plain, towered = twin(spectral_model, towers)
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    towered.compile(
        optimizer=keras.optimizers.Adam(0.01), loss="mse", run_eagerly=run_eagerly
    )
    assert_same_history(fit(plain, oracle=True), fit(towered))
    assert_same_weights(plain, towered)  # vector_u included
    assert towered.evaluate(X, Y, batch_size=7, verbose=0) == pytest.approx(
        plain.evaluate(X, Y, batch_size=7, verbose=0), rel=1e-5
    )


@keras3_only  # Keras 2 has no replicas
def test_spectral_normalization_with_replicas():
    plain, towered = twin(spectral_model, 3, replicate_variables=True)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    assert_same_history(fit(plain, oracle=True), fit(towered))
    assert_same_weights(plain, towered)
    # Every replica holds the normalised kernels the primary holds.
    replicas = towered._tower_step.replicas
    for tower in (1, 2):
        for primary, copy in zip(
            towered.trainable_weights, replicas.replica_variables(tower)
        ):
            np.testing.assert_array_equal(copy.numpy(), primary.numpy())


@spectral_normalization
def test_spectral_normalization_with_accumulation():
    # One device accumulating runs the update once per micro-batch too.
    one = kerastower.TowerModel.from_model(spectral_model(), towers=1)
    three = kerastower.TowerModel.from_model(spectral_model(), towers=3)
    three.set_weights(one.get_weights())
    histories = []
    for model in (one, three):
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        accumulation = [GradientAccumulation(2)]
        histories.append(fit(model, 4, oracle=model is one, callbacks=accumulation))
    assert_same_history(*histories)
    assert_same_weights(one, three)


@spectral_normalization
def test_spectral_normalization_in_a_custom_step():
    class Regressor(kerastower.TowerModel):
        def train_step(self, data):
            x, y = data
            variables = self.trainable_weights

            def loss_fn(x, y):
                return tf.reduce_mean(tf.square(y - self(x, training=True)))

            grads, loss = self.tower_gradients(loss_fn, variables, x, y)
            self.optimizer.apply_gradients(zip(grads, variables))
            return {"loss": loss}

    class Plain(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(y - self(x, training=True)))
            variables = self.trainable_weights
            grads = tape.gradient(loss, variables)
            self.optimizer.apply_gradients(zip(grads, variables))
            return {"loss": loss}

    source = spectral_model()
    plain = Plain(source.inputs, source.outputs)
    source = spectral_model()
    towered = Regressor(source.inputs, source.outputs, towers=3)
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.Adam(0.01))
    assert_same_history(fit(plain, oracle=True), fit(towered))
    assert_same_weights(plain, towered)


@spectral_normalization
def test_a_changed_spectral_normalization_hook_is_an_error(monkeypatch):
    # Keras 3 updates through `normalized_weights()`, Keras 2 through
    # `normalize_weights()`; the layer still runs with the new signature.
    hook = "normalize_weights" if KERAS_2 else "normalized_weights"
    original = getattr(keras.layers.SpectralNormalization, hook)

    def changed(self, iterations=1):  # a new signature
        return original(self)

    monkeypatch.setattr(keras.layers.SpectralNormalization, hook, changed)
    model = kerastower.TowerModel.from_model(spectral_model(), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(_keras_compat.KerasCompatibilityError, match=hook):
        fit(model)


class Counter(keras.layers.Layer):
    """Counts its training calls: an update that does not depend on the batch."""

    def build(self, input_shape):
        self.calls = self.add_weight(
            shape=(), initializer="zeros", trainable=False, name="calls"
        )

    def call(self, inputs, training=False):
        if training:
            self.calls.assign_add(1.0)
        return inputs


def counter_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2))
    h = Counter()(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(h))


@assigning_layers
@pytest.mark.parametrize("towers", [2, 3])
@pytest.mark.parametrize("replicate", [False, True], ids=["shared", "replicas"])
@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_a_layer_assigning_in_training_assigns_once_per_step(
    towers, replicate, run_eagerly
):
    # Each tower used to read what the one before it assigned: the counter
    # advanced once per tower (12 after 6 steps on 2 towers). Stock
    # MirroredStrategy counts 6.
    plain, towered = twin(counter_model, towers, replicate_variables=replicate)
    plain.compile(optimizer="sgd", loss="mse")
    towered.compile(optimizer="sgd", loss="mse", run_eagerly=run_eagerly)
    assert_same_history(fit(plain, oracle=True), fit(towered))
    assert_same_weights(plain, towered)
    calls = [w for w in towered.weights if w.path.endswith("calls")]
    assert [float(c.numpy()) for c in calls] == [6.0]  # 3 steps an epoch, 2 epochs


def test_unsynchronised_batch_norm_keeps_the_first_towers_statistics():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    dense = keras.layers.Dense(3)
    outputs = keras.layers.BatchNormalization(momentum=0.9)(dense(inputs))
    model = kerastower.TowerModel(inputs, outputs, towers=3, sync_batch_norm=False)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    x = RNG.normal(size=(9, 4)).astype("float32")
    model.fit(x, np.zeros((9, 3), "float32"), batch_size=9, shuffle=False, verbose=0)
    # As stock MirroredStrategy keeps its first replica's: tower 0's shard
    # (examples 0-2) alone, one update from the initial zeros.
    shard = x[:3] @ dense.kernel.numpy() + dense.bias.numpy()
    bn = model.layers[-1]
    np.testing.assert_allclose(
        bn.moving_mean.numpy(), 0.1 * shard.mean(axis=0), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(
        bn.moving_variance.numpy(),
        0.9 + 0.1 * shard.var(axis=0),
        rtol=1e-5,
        atol=1e-7,
    )


@keras3_only  # Keras 2's random layers keep no seed state
def test_random_layers_draw_their_own_numbers_on_every_tower():
    # Tower i draws from the seed state (s0 + i, s1): towers draw different
    # dropout masks, and the generator advances once per step, as on one
    # device, with and without replicas (towers with replicas once dropped
    # their draws, and towers 1 and 2 drew the same masks).
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 6, 2))
        h = keras.layers.Dropout(0.5)(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    def seed_state(model):
        (state,) = [
            v.numpy() for v in model.non_trainable_variables if "seed" in v.path
        ]
        return state

    plain = build()
    plain.compile(optimizer="sgd", loss="mse")
    plain.fit(X[:9], Y[:9], batch_size=9, verbose=0)
    for replicate in (False, True):
        model = kerastower.TowerModel.from_model(
            build(), towers=3, replicate_variables=replicate
        )
        model.compile(optimizer="sgd", loss="mse")
        model.fit(X[:9], Y[:9], batch_size=9, verbose=0)
        np.testing.assert_array_equal(seed_state(model), seed_state(plain))


def test_towers_draw_different_dropout_masks():
    def rows_like_the_first(y_true, y_pred):
        del y_true
        same = tf.reduce_all(tf.equal(y_pred, y_pred[:1]), axis=1)
        return tf.cast(same, "float32")

    keras.utils.set_random_seed(0)
    inputs = keras.Input((72,))
    h = keras.layers.Dropout(0.5)(inputs)
    outputs = keras.layers.Dense(72, use_bias=False, kernel_initializer="identity")(h)
    model = kerastower.TowerModel(inputs, outputs, towers=3)
    model.compile(optimizer="sgd", loss="mse", metrics=[rows_like_the_first])
    ones = np.ones((3, 72), "float32")
    history = model.fit(ones, ones, batch_size=3, verbose=0).history
    # One example per tower, the same input: the same mask on every tower
    # would give 1.0; a 72-unit mask repeats with probability 2**-72.
    assert history["rows_like_the_first"][0] == pytest.approx(1 / 3)


class ClipOwnKernel(keras.layers.Layer):
    """Clips its trainable kernel in the forward pass: kerastower cannot know
    that a second assignment on top of the first changes nothing."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 1), name="kernel")

    def call(self, inputs, training=False):
        if training:
            self.kernel.assign(keras.ops.clip(self.kernel, -0.1, 0.1))
        return keras.ops.matmul(inputs, self.kernel)


def assignment_warnings(build, towers):
    model = kerastower.TowerModel.from_model(build(), towers=towers)
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model)
    return [str(w.message) for w in caught if "assigns the trainable" in str(w.message)]


@assigning_layers
def test_a_layer_assigning_a_trainable_weight_warns():
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6, 6, 2))
        return keras.Model(inputs, ClipOwnKernel()(keras.layers.Flatten()(inputs)))

    (message, *_) = assignment_warnings(build, 2)
    assert "clip_own_kernel/kernel" in message
    assert assignment_warnings(build, 1) == []
    assert assignment_warnings(spectral_model, 3) == []


def _aggregation(name: str):
    """A weight's aggregation as the Keras family takes it (Keras 2: the enum)."""
    return tf.VariableAggregation[name.upper()] if KERAS_2 else name


class BatchSum(keras.layers.Layer):
    """The subclassing guide's ``ComputeSum``: a running sum of its inputs
    over every batch it sees, with a count of its calls."""

    def __init__(self, aggregation="sum", **kwargs):
        super().__init__(**kwargs)
        self.aggregation = aggregation

    def build(self, input_shape):
        self.total = self.add_weight(
            shape=(input_shape[-1],),
            initializer="zeros",
            trainable=False,
            aggregation=_aggregation(self.aggregation),
            name="total",
        )
        self.calls = self.add_weight(
            shape=(),
            initializer="zeros",
            trainable=False,
            aggregation=_aggregation("only_first_replica"),
            name="calls",
        )

    def call(self, inputs):
        # Keras 2 has no `keras.ops`.
        total = tf.reduce_sum if KERAS_2 else keras.ops.sum
        self.total.assign_add(total(inputs, axis=0))
        self.calls.assign_add(1.0)
        return inputs


def batch_sum_model(aggregation="sum"):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 6, 2))
    h = BatchSum(aggregation)(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def running_state(model):
    (layer,) = [layer for layer in model.layers if isinstance(layer, BatchSum)]
    return layer.total.numpy(), float(layer.calls.numpy())


@running_sums
@pytest.mark.parametrize("replicate", [False, True], ids=["shared", "replicas"])
def test_a_running_sum_over_the_batch_is_one_devices_in_fit_evaluate_and_predict(
    replicate,
):
    # Before, `fit` summed only tower 0's shard (30.7 off; stock is wrong
    # too), and `evaluate` and `predict` counted every tower's call.
    plain, towered = twin(batch_sum_model, 3, replicate_variables=replicate)
    for model in (plain, towered):
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        histories = [fit(m, 5, oracle=m is plain) for m in (plain, towered)]
        assert_same_history(*histories)
        for phase in ("fit", "evaluate", "predict"):
            if phase == "evaluate":
                scores = [
                    m.evaluate(X, Y, batch_size=5, verbose=0) for m in (plain, towered)
                ]
                np.testing.assert_allclose(scores[1], scores[0], rtol=1e-5)
            if phase == "predict":
                outputs = [
                    m.predict(X, batch_size=5, verbose=0) for m in (plain, towered)
                ]
                np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
            (total, calls), (want_total, want_calls) = map(
                running_state, (towered, plain)
            )
            np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-5)
            assert calls == want_calls, phase
    assert_same_weights(plain, towered)
    assert not [w for w in caught if "non-trainable" in str(w.message)]


@running_sums
def test_a_running_sum_without_aggregation_keeps_tower_0s_and_warns():
    model = kerastower.TowerModel.from_model(batch_sum_model("none"), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(
        UserWarning, match=r"non-trainable weights \['batch_sum(_\d+)?/total'\]"
    ):
        model.fit(X[:4], Y[:4], batch_size=4, shuffle=False, verbose=0)
    total, calls = running_state(model)
    flat = X[:2].reshape(2, -1)  # tower 0's shard
    np.testing.assert_allclose(total, flat.sum(axis=0), rtol=1e-6, atol=1e-6)
    assert calls == 1.0


@keras2_only
@pytest.mark.parametrize(
    "build, phase",
    [
        (counter_model, "fit"),
        (batch_sum_model, "fit"),
        (batch_sum_model, "evaluate"),
    ],
    ids=["counter-fit", "running_sum-fit", "running_sum-evaluate"],
)
def test_keras_2_refuses_a_forward_pass_that_assigns_a_weight(build, phase):
    # Keras 2 towers cannot hold their assignments: each would assign in
    # turn (the counter counted 12 for one device's 6 on 2 towers).
    model = kerastower.TowerModel.from_model(build(), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(
        ValueError, match=r"assigns the model's weights \['(counter|batch_sum)"
    ):
        if phase == "fit":
            fit(model)
        else:
            model.evaluate(X, Y, batch_size=10, verbose=0)


@keras2_only
def test_keras_2_trains_a_forward_pass_that_assigns_a_weight_on_one_tower():
    # What the refusal above offers instead: one tower, as one device.
    plain, towered = twin(counter_model, 1)
    plain.compile(optimizer="sgd", loss="mse")
    towered.compile(optimizer="sgd", loss="mse")
    assert_same_history(fit(plain, oracle=True), fit(towered))
    assert_same_weights(plain, towered)
    calls = [w for w in towered.weights if "calls" in w.name]
    assert [float(c.numpy()) for c in calls] == [6.0]
