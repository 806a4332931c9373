"""The keras.io "Customizing what happens in fit()" idioms work on TowerModel."""

import warnings

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_MINOR, keras
from oracle import assert_same_history, assert_same_weights, regression_data

import kerastower
from kerastower.model import FunctionalTowerModel

X, Y = regression_data(n=23)
BASES = kerastower.TowerModel.__bases__


def graph(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(7, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(1)(hidden)


def extra_loss(y, y_pred):
    return 2.0 * tf.reduce_mean(tf.square(y - y_pred))


class PlainCustomLoss(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kw):
        loss = super().compute_loss(x, y, y_pred, sample_weight, **kw)
        return loss + extra_loss(y, y_pred)


@keras.saving.register_keras_serializable(package="tests")
class TowerCustomLoss(kerastower.TowerModel):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kw):
        loss = super().compute_loss(x, y, y_pred, sample_weight, **kw)
        return loss + extra_loss(y, y_pred)


class TowerCustomLossInit(kerastower.TowerModel):
    def __init__(self, seed=0, **kwargs):
        inputs, outputs = graph(seed)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kw):
        loss = super().compute_loss(x, y, y_pred, sample_weight, **kw)
        return loss + extra_loss(y, y_pred)


def train(model):
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model.fit(X, Y, batch_size=7, epochs=2, shuffle=False, verbose=0).history


@pytest.mark.parametrize("style", ["inputs-outputs", "super-init"])
def test_compute_loss_override_on_a_graph_subclass(style):
    plain = PlainCustomLoss(*graph())
    if style == "inputs-outputs":
        towered = TowerCustomLoss(*graph(), towers=3)
    else:
        towered = TowerCustomLossInit(towers=3)
    assert isinstance(towered, TowerCustomLoss | TowerCustomLossInit)
    assert isinstance(towered, FunctionalTowerModel)
    towered.set_weights(plain.get_weights())
    assert_same_history(train(plain), train(towered))
    assert_same_weights(plain, towered)
    # No class's bases were rewritten: a subclassed TowerModel still builds.
    assert kerastower.TowerModel.__bases__ == BASES
    assert keras.Model in BASES

    class Subclassed(kerastower.TowerModel):
        def __init__(self):
            super().__init__(towers=2)
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(X, Y, batch_size=8, verbose=0)
    assert model.num_towers == 2


def test_graph_subclass_saves_and_loads(tmp_path):
    model = TowerCustomLoss(*graph(), towers=2)
    train(model)
    model.save(tmp_path / "m.keras")
    # Keras 2.12 saves ``.keras`` as HDF5, which needs the class of one's
    # own, as it does for any `keras.Model` subclass.
    custom = {"TowerCustomLoss": TowerCustomLoss} if KERAS_MINOR < (2, 13) else None
    loaded = keras.saving.load_model(tmp_path / "m.keras", custom_objects=custom)
    assert type(loaded).__name__ == "TowerCustomLoss"
    assert isinstance(loaded, TowerCustomLoss)
    assert_same_weights(model, loaded, rtol=0, atol=0)


def test_a_subclass_with_call_cannot_take_a_graph():
    class WithCall(kerastower.TowerModel):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="defines `call`"):
        WithCall(*graph())


class TrainStepOnly:
    """The keras.io GAN/VAE pattern: a model with no `call`, its own step."""

    def __init__(self, net, **kwargs):
        super().__init__(**kwargs)
        self.net = net
        self.tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(y - self.net(x, training=True)))
        grads = tape.gradient(loss, self.net.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.net.trainable_weights))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


class PlainTrainStep(TrainStepOnly, keras.Model):
    pass


class TowerTrainStep(TrainStepOnly, kerastower.TowerModel):
    pass


def test_train_step_override_without_call_trains_as_keras_model():
    plain = PlainTrainStep(keras.Model(*graph()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        towered = TowerTrainStep(keras.Model(*graph()), towers=3)
    assert any("not split across towers" in str(w.message) for w in caught)
    histories = []
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        histories.append(
            model.fit(X, Y, batch_size=7, epochs=2, shuffle=False, verbose=0).history
        )
    assert_same_history(*histories)
    for a, b in zip(plain.net.get_weights(), towered.net.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # the same step on one device: exact


class Chatty(keras.layers.Layer):
    def call(self, x):
        warnings.warn("chatty layer called", UserWarning, stacklevel=1)
        return x


def test_a_warning_raised_in_a_step_is_shown_as_often_as_on_one_device():
    def count(model_class, **kwargs):
        inputs = keras.Input((5,))
        outputs = keras.layers.Dense(1)(Chatty()(inputs))
        model = model_class(inputs, outputs, **kwargs)
        model.compile(optimizer="sgd", loss="mse")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.train_on_batch(X[:7], Y[:7])
        return [str(w.message) for w in caught].count("chatty layer called")

    assert count(kerastower.TowerModel, towers=3) == count(keras.Model) >= 1


class TrackedLoss(kerastower.TowerModel):
    """Tracks its loss in `compute_loss`, as keras.io's custom-fit guide does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tracker = keras.metrics.Mean(name="tracked")

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kw):
        loss = super().compute_loss(x, y, y_pred, sample_weight, **kw)
        self.tracker.update_state(loss)
        return loss


def test_a_mean_of_the_loss_updated_in_compute_loss_is_the_batchs_loss():
    # The documented rule (Concepts, Limits): a `Mean` updated with a batch
    # scalar counts each tower by its share of the loss, so a `Mean` of the
    # loss is the whole batch's; before, it was the towers' unweighted mean.
    model = TrackedLoss(*graph(), towers=2)
    model.compile(optimizer="sgd", loss="mse")
    x, y = X[:5], Y[:5]  # towers of 3 and 2 examples
    logs = model.evaluate(x, y, batch_size=5, verbose=0, return_dict=True)
    errors = (model.predict(x, batch_size=5, verbose=0) - y) ** 2
    per_tower = [errors[:3].mean(), errors[3:].mean()]
    np.testing.assert_allclose(logs["loss"], errors.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logs["tracked"], errors.mean(), rtol=1e-5, atol=1e-6)
    assert abs(np.mean(per_tower) - errors.mean()) > 1e-3  # the old value differs
