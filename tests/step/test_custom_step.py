"""`TowerModel.tower_gradients`: a custom `train_step` on the towers equals one device.

The oracle is the same model as a plain `keras.Model` whose `train_step` takes
its gradients with `tf.GradientTape` on one device, from the same weights,
random draws and data.
"""

import functools
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_2, keras, keras3_only
from oracle import assert_close, float64, plain_fit_data, regression_data

import kerastower
import kerastower.step.tower_step

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import dcgan_towers as dcgan  # noqa: E402

# 23 images in batches of 5: the discriminator splits 10 examples, the
# generator 5 (uneven on 2, 3 and 4 towers); the last batch of 3 leaves the
# generator's fourth tower empty (it runs whole on the first tower).
IMAGES = dcgan.make_images(23)


def train(cls, epochs=2, **kwargs):
    """`dcgan.train` on `IMAGES` in float64.

    Adam at a learning rate of 1e-4 turns the rounding of a gradient near 0
    into a step of up to 1e-4, and the noisy labels tie each image to its
    place in the batch: in float32 another CPU's summation order, which no
    reordering of the batch can simulate, would be as far from one device as
    the towers could be. In float64 the towers are 3e-17 from one device.
    """
    with float64():
        return dcgan.train(cls, IMAGES, epochs=epochs, **kwargs)


@functools.cache
def one_device_gan(run_eagerly):
    gan, logs = train(dcgan.GAN, run_eagerly=run_eagerly)
    return gan.discriminator.get_weights() + gan.generator.get_weights(), logs


@functools.cache
def moved_by_training():
    """How far two epochs on one device move the GAN's weights, at most."""
    initial, _ = train(dcgan.GAN, epochs=0)
    return max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(gan_weights(initial), one_device_gan(False)[0], strict=True)
    )


def gan_weights(gan):
    return gan.discriminator.get_weights() + gan.generator.get_weights()


@keras3_only  # examples/dcgan_towers.py is Keras 3 code
@pytest.mark.parametrize("towers, run_eagerly", [(4, False), (4, True), (2, False)])
def test_dcgan_on_towers_trains_as_on_one_device(towers, run_eagerly):
    expected_weights, expected_logs = one_device_gan(run_eagerly)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "not split" warning
        gan, logs = train(dcgan.TowerGAN, run_eagerly=run_eagerly, towers=towers)
    assert gan.num_towers == towers
    assert len(logs["d_loss"]) == len(expected_logs["d_loss"]) == 10
    for key in ("d_loss", "g_loss"):
        assert_close(logs[key], expected_logs[key], 1e-10, 1e-12, err_msg=key)
    for actual, expected in zip(gan_weights(gan), expected_weights, strict=True):
        assert actual.dtype == "float64"
        assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    # The comparison is not vacuous: training moved the weights by far more
    # than the tolerance, and the losses are real BCE values.
    assert moved_by_training() > 5e-4
    assert 0.3 < logs["d_loss"][-1] < 1.0 and 0.3 < logs["g_loss"][-1] < 1.5


@keras3_only
def test_one_tower_is_the_tape_on_one_device(monkeypatch):
    expected_weights, expected_logs = one_device_gan(False)

    def no_towers(*args, **kwargs):
        raise AssertionError("one tower must not run the tower strategy")

    monkeypatch.setattr(kerastower.step.tower_runs.TowerRuns, "split_run", no_towers)
    gan, logs = train(dcgan.TowerGAN, towers=1)
    assert gan.num_towers == 1
    assert logs == expected_logs  # the same operations: bit for bit
    for actual, expected in zip(gan_weights(gan), expected_weights, strict=True):
        np.testing.assert_array_equal(actual, expected)


# -- a custom train_step with compiled losses, metrics and embeddings -------

VOCAB, LENGTH = 12, 6


def token_model(mask_zero, seed=0):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((LENGTH,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, 4, mask_zero=mask_zero)(tokens)
    hidden = keras.layers.Dense(5, activation="tanh")(hidden)
    return tokens, keras.layers.Dense(1)(hidden)  # one value per token


def token_data(n=23, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(n, LENGTH)).astype("int32")
    lengths = rng.integers(1, LENGTH + 1, size=n)
    x[np.arange(LENGTH) >= lengths[:, None]] = 0  # padding: masked tokens
    y = rng.normal(size=(n, LENGTH, 1)).astype("float32")
    return x, y


class KerasIoStep:
    """keras.io's "Customizing fit()" step; `gradients` is its tape."""

    def train_step(self, data):
        x, y = data

        def loss_fn(x, y):
            y_pred = self(x, training=True)
            return self.compute_loss(x=x, y=y, y_pred=y_pred), y_pred

        variables = self.trainable_variables
        grads, loss, y_pred = self.gradients(loss_fn, variables, x, y)
        self.optimizer.apply_gradients(zip(grads, variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class PlainStep(KerasIoStep, keras.Model):
    def gradients(self, loss_fn, variables, *tensors):
        with tf.GradientTape() as tape:
            loss, y_pred = loss_fn(*tensors)
        return tape.gradient(loss, variables), loss, y_pred


class TowerStep(KerasIoStep, kerastower.TowerModel):
    def gradients(self, loss_fn, variables, *tensors):
        return self.tower_gradients(loss_fn, variables, *tensors, has_aux=True)


def fit(model, x, y, oracle=False):
    """Fits on x, y; the `oracle` (one device) on `plain_fit_data`'s."""
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    kwargs = dict(batch_size=5, epochs=2, shuffle=False, verbose=0)
    x, y, kwargs = plain_fit_data(x, y, kwargs) if oracle else (x, y, kwargs)
    return model.fit(x, y, **kwargs).history


@pytest.mark.parametrize("mask_zero", [True, False], ids=["masked", "unmasked"])
def test_custom_step_with_compiled_loss_and_embeddings_equals_one_device(mask_zero):
    x, y = token_data()
    plain = PlainStep(*token_model(mask_zero))
    with warnings.catch_warnings():
        # The step calls `tower_gradients` through a helper of its own.
        warnings.filterwarnings("ignore", message=".*not split across towers")
        towered = TowerStep(*token_model(mask_zero), towers=4)
    expected, history = fit(plain, x, y, oracle=True), fit(towered, x, y)
    # Keras 2 builds the compiled metrics only when they are first updated
    # (`compiled_metrics.update_state`): `self.metrics` holds the loss alone.
    assert sorted(history) == sorted(expected) == ["loss"] + ["mae"] * (not KERAS_2)
    for key in history:
        assert_close(history[key], expected[key], err_msg=key)
    for a, b in zip(towered.get_weights(), plain.get_weights(), strict=True):
        assert_close(a, b)
    assert expected["loss"][-1] < expected["loss"][0]


def test_from_model_keeps_the_step_of_its_own_class_and_refuses_to_drop_one():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not split across towers")
        kept = TowerStep.from_model(keras.Model(*token_model(False)), towers=2)
    assert type(kept).train_step is KerasIoStep.train_step
    rewrapped = kerastower.TowerModel.from_model(
        kerastower.TowerModel.from_model(keras.Model(*token_model(False))), towers=2
    )
    assert type(rewrapped).train_step is kerastower.TowerModel.train_step
    # A plain model's own step would be dropped: one device trained it
    # differently (0.058 off after 2 epochs for a step updating one layer).
    with pytest.raises(ValueError, match=r"which defines KerasIoStep\.train_step"):
        kerastower.TowerModel.from_model(PlainStep(*token_model(False)), towers=2)


class MeanSquaredStep:
    """A step whose loss is written out, for a model with `call`."""

    def train_step(self, data):
        x, y = data

        def loss_fn(x, y):
            y_pred = self(x, training=True)
            return tf.reduce_mean(tf.square(y - y_pred))

        variables = self.trainable_weights
        grads, loss = self.gradients(loss_fn, variables, x, y)
        self.optimizer.apply_gradients(zip(grads, variables))
        return {"loss": loss}


class PlainMeanSquared(MeanSquaredStep, keras.Model):
    def gradients(self, loss_fn, variables, *tensors):
        with tf.GradientTape() as tape:
            loss = loss_fn(*tensors)
        return tape.gradient(loss, variables), loss


class TowerMeanSquared(MeanSquaredStep, kerastower.TowerModel):
    def gradients(self, loss_fn, variables, *tensors):
        return self.tower_gradients(loss_fn, variables, *tensors)


def batch_norm_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    # No bias before the normalization: its true gradient is 0, and Adam
    # turns rounding noise there into full-size steps, on one device too.
    hidden = keras.layers.Dense(7, use_bias=False)(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.Activation("tanh")(hidden)
    return inputs, keras.layers.Dense(1)(hidden)


def test_batch_normalization_in_loss_fn_sees_the_global_batch():
    x, y = regression_data(n=23)
    fit = dict(batch_size=7, epochs=2, shuffle=False, verbose=0)
    histories, weights = [], []
    for cls, kwargs, (xs, ys, fit_kwargs) in (
        (PlainMeanSquared, {}, plain_fit_data(x, y, fit)),
        (TowerMeanSquared, {"towers": 4}, (x, y, fit)),
        (TowerMeanSquared, {"towers": 4, "sync_batch_norm": False}, (x, y, fit)),
    ):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not split across towers")
            model = cls(*batch_norm_model(), **kwargs)
        model.compile(optimizer=keras.optimizers.Adam(0.01))
        histories.append(model.fit(xs, ys, **fit_kwargs).history)
        weights.append(model.get_weights())
    assert_close(histories[1]["loss"], histories[0]["loss"])
    for a, b in zip(weights[1], weights[0], strict=True):
        assert_close(a, b)  # moving mean and variance included
    # Per-tower statistics (sync_batch_norm=False) train another model.
    assert max(np.max(np.abs(a - b)) for a, b in zip(weights[2], weights[0])) > 1e-2


def test_gradients_outside_a_step_equal_the_tape_and_stay_sparse():
    x, y = token_data(n=7)
    model = kerastower.TowerModel(*token_model(mask_zero=False), towers=3)
    variables = model.trainable_weights

    def loss_fn(x, y):  # the mean over the examples it is given
        return tf.reduce_mean(tf.square(y - model(x)))

    with tf.GradientTape() as tape:
        expected_loss = loss_fn(x, y)
    expected = tape.gradient(expected_loss, variables)
    assert isinstance(expected[0], tf.IndexedSlices)  # the embedding table

    eager = model.tower_gradients(loss_fn, variables, x, y)
    traced = tf.function(lambda x, y: model.tower_gradients(loss_fn, variables, x, y))
    for grads, loss in (eager, traced(x, y)):
        assert isinstance(grads[0], tf.IndexedSlices)
        assert_close(loss, expected_loss)
        for actual, want in zip(grads, expected, strict=True):
            assert_close(tf.convert_to_tensor(actual), tf.convert_to_tensor(want))


def test_unconnected_variables_get_none_and_outputs_come_back_in_order():
    model = kerastower.TowerModel(*token_model(mask_zero=False), towers=4)
    other = (tf.Variable if KERAS_2 else keras.Variable)(1.0)
    x, y = token_data(n=6)

    def loss_fn(x, y):
        y_pred = model(x)
        return tf.reduce_mean(tf.square(y - y_pred)), {"y_pred": y_pred}

    grads, _, outputs = model.tower_gradients(
        loss_fn, [other, *model.trainable_weights], x, y, has_aux=True
    )
    assert grads[0] is None
    assert_close(outputs["y_pred"], model.predict(x, verbose=0))


def test_the_warning_names_tower_gradients_and_is_not_shown_when_it_is_used():
    class Unsplit(kerastower.TowerModel):
        def train_step(self, data):
            return {}

    class Split(kerastower.TowerModel):
        def train_step(self, data):
            return self.tower_gradients(lambda x: x, [], data)

    with pytest.warns(UserWarning, match="self.tower_gradients"):
        Unsplit(*token_model(False), towers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Split(*token_model(False), towers=2)


# -- bad inputs -------------------------------------------------------------


@pytest.fixture(scope="module", params=[1, 3], ids=["1-tower", "3-towers"])
def model(request):
    return kerastower.TowerModel(*token_model(mask_zero=False), towers=request.param)


def mse(x, y):
    return tf.reduce_mean(tf.square(y - x))


X = np.ones((6, 1), "float32")


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("mse", "VARIABLES", X, X), {}, "`loss_fn` must be a callable"),
        ((mse, "VARIABLE", X, X), {}, "`variables` must be a list of variables"),
        ((mse, [np.ones(2)], X, X), {}, "Received: a ndarray in variables"),
        ((mse, "VARIABLES"), {}, "needs at least one tensor"),
        ((mse, "VARIABLES", X, 1.0), {}, "Received: a scalar tensor"),
        ((mse, "VARIABLES", X, X[:5]), {}, r"same batch size.*\(6, 1\), \(5, 1\)"),
        ((mse, "VARIABLES", X, X), {"has_aux": 1}, "`has_aux` must be a bool"),
        ((mse, "VARIABLES", X, X), {"has_aux": True}, "must return a pair"),
        ((lambda x, y: x - y, "VARIABLES", X, X), {}, "loss of shape"),
        ((lambda x, y: (mse(x, y), 1.0), "VARIABLES", X, X), {}, "has_aux=True"),
        (
            (lambda x, y: (mse(x, y), mse(x, y)), "VARIABLES", X, X),
            {"has_aux": True},
            "examples on axis 0",
        ),
    ],
)
def test_bad_arguments_raise_keras_style_errors(model, args, kwargs, match):
    variable = model.trainable_weights[-1]
    args = [
        {"VARIABLES": [variable], "VARIABLE": variable}.get(a, a)
        if isinstance(a, str)
        else a
        for a in args
    ]
    with pytest.raises(ValueError, match=match):
        model.tower_gradients(*args, **kwargs)


def test_batch_sizes_known_only_at_run_time_must_agree(model):
    variable = model.trainable_weights[-1]

    @tf.function(input_signature=[tf.TensorSpec([None, 1])] * 2)
    def step(a, b):
        return model.tower_gradients(
            lambda a, b: mse(a * variable, b), [variable], a, b
        )[1]

    assert_close(step(X, 2 * X), mse(X * variable, 2 * X))
    with pytest.raises(tf.errors.InvalidArgumentError, match="same batch size"):
        step(X, X[:5])


def test_it_cannot_run_inside_a_strategy(model):
    variable = model.trainable_weights[-1]
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(RuntimeError, match="inside a strategy's scope"):
            model.tower_gradients(mse, [variable], X, X)


def test_it_cannot_run_inside_its_own_loss_fn():
    model = kerastower.TowerModel(*token_model(mask_zero=False), towers=3)
    variable = model.trainable_weights[-1]

    def nested(x):
        return model.tower_gradients(mse, [variable], x, x)[1]

    with pytest.raises(RuntimeError, match="such as inside `loss_fn`"):
        model.tower_gradients(nested, [variable], X)
