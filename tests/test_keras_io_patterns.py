"""keras.io patterns written as keras.io writes them, on `TowerModel`."""

import warnings

import numpy as np
import pytest
from keras_family import keras, keras3_only
from oracle import assert_same_history, assert_same_weights

import kerastower

pytestmark = keras3_only  # `keras.random` and `keras.ops`, as keras.io writes them
ops = getattr(keras, "ops", None)


class Sampling(keras.layers.Layer):
    """keras.io's VAE sampling layer: ``z = mean + exp(log_var / 2) * eps``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        shape = ops.shape(z_mean)
        epsilon = keras.random.normal(shape=shape, seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


def encoder_decoder():
    keras.utils.set_random_seed(0)
    images = keras.Input((8, 8, 1))
    h = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(images))
    z_mean = keras.layers.Dense(2, name="z_mean")(h)
    z_log_var = keras.layers.Dense(2, name="z_log_var")(h)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(images, [z_mean, z_log_var, z], name="encoder")
    latent = keras.Input((2,))
    pixels = keras.layers.Dense(64, activation="sigmoid")(latent)
    decoder = keras.Model(latent, keras.layers.Reshape((8, 8, 1))(pixels))
    return encoder, decoder


def vae_class(base):
    class VAE(base):
        """keras.io's "Variational AutoEncoder", its `__init__` and step."""

        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker]

        def train_step(self, data):
            import tensorflow as tf

            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder(data)
                reconstruction = self.decoder(z)
                reconstruction_loss = ops.mean(
                    ops.sum(
                        keras.losses.binary_crossentropy(data, reconstruction),
                        axis=(1, 2),
                    )
                )
                kl_loss = -0.5 * (
                    1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var)
                )
                total_loss = reconstruction_loss + ops.mean(ops.sum(kl_loss, axis=1))
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            return {"loss": self.total_loss_tracker.result()}

    return VAE


def test_a_vae_built_from_its_encoder_and_decoder_trains_as_keras_does():
    # `TowerModel.__new__` took any two positional arguments for inputs and
    # outputs: "Functional.__init__() missing 'inputs' and 'outputs'".
    images = np.random.default_rng(0).uniform(size=(20, 8, 8, 1)).astype("float32")
    histories, models = [], []
    for base in (keras.Model, kerastower.TowerModel):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a train_step of its own: one device
            model = vae_class(base)(*encoder_decoder())
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        histories.append(model.fit(images, epochs=2, batch_size=8, verbose=0).history)
        models.append(model)
    assert isinstance(models[1], kerastower.TowerModel)
    assert models[1].encoder.name == "encoder"
    assert_same_history(*histories)
    assert_same_weights(*models)


def test_a_subclass_without_init_still_builds_from_inputs_and_outputs():
    class Regressor(kerastower.TowerModel):
        pass

    inputs = keras.Input((3,))
    model = Regressor(inputs, keras.layers.Dense(1)(inputs), towers=2)
    assert isinstance(model, Regressor)
    assert model.num_towers == 2
    assert model.output.shape == (None, 1)


@pytest.mark.parametrize("keyword", [True, False])
def test_a_subclass_passing_inputs_and_outputs_on_is_functional(keyword):
    class Passing(kerastower.TowerModel):
        def __init__(self, width, **kwargs):
            inputs = keras.Input((3,))
            outputs = keras.layers.Dense(width)(inputs)
            if keyword:
                super().__init__(inputs=inputs, outputs=outputs, **kwargs)
            else:
                super().__init__(inputs, outputs, **kwargs)

    model = Passing(4, towers=2)
    assert model.output.shape == (None, 4)
    assert model.num_towers == 2


class ZeroKernelForEvaluation(keras.callbacks.Callback):
    """Zeros the first kernel as evaluation or prediction begins, restores it
    as it ends: a callback that changes the weights the towers read."""

    def _zero(self, logs=None):
        kernel = self.model.layers[1].kernel
        self.saved = kernel.numpy()
        kernel.assign(np.zeros_like(self.saved))

    def _restore(self, logs=None):
        self.model.layers[1].kernel.assign(self.saved)

    on_test_begin = on_predict_begin = _zero
    on_test_end = on_predict_end = _restore


def regressor(towers=None, **kwargs):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    h = keras.layers.Dense(8, activation="tanh")(inputs)
    outputs = keras.layers.Dense(1)(h)
    if towers is None:
        return keras.Model(inputs, outputs)
    return kerastower.TowerModel(inputs, outputs, towers=towers, **kwargs)


@pytest.mark.parametrize("replicas", [False, True])
def test_weights_a_callback_changes_as_evaluation_begins_reach_every_tower(replicas):
    # With replicas, `evaluate` copied the weights to the replicas before the
    # callbacks' `on_test_begin`: only the first tower evaluated the change
    # (0.888 on replicas, 0.740 on one device, measured).
    rng = np.random.default_rng(0)
    x = rng.normal(size=(23, 5)).astype("float32")
    y = x[:, :1] + 0.5
    plain, towered = regressor(), regressor(3, replicate_variables=replicas)
    towered.set_weights(plain.get_weights())
    results = []
    for model in (plain, towered):
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        callbacks = [ZeroKernelForEvaluation()]
        results.append(
            (
                model.evaluate(x, y, batch_size=8, callbacks=callbacks, verbose=0),
                model.predict(x, batch_size=8, callbacks=callbacks, verbose=0),
                model.evaluate(x, y, batch_size=8, verbose=0),  # restored
            )
        )
    for expected, got in zip(*results, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("replicas", [False, True])
def test_swap_ema_weights_validates_with_the_moving_averages(replicas):
    # keras.callbacks.SwapEMAWeights swaps the optimizer's moving averages in
    # for validation: val_loss 0.2973 on replicas against 0.2944 (measured).
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 5)).astype("float32")
    y = np.tanh(x[:, :1])
    plain, towered = regressor(), regressor(3, replicate_variables=replicas)
    towered.set_weights(plain.get_weights())
    histories = []
    for model in (plain, towered):
        model.compile(optimizer=keras.optimizers.SGD(0.05, use_ema=True), loss="mse")
        histories.append(
            model.fit(
                x,
                y,
                batch_size=8,
                epochs=3,
                shuffle=False,
                verbose=0,
                validation_data=(x[:17], y[:17]),
                callbacks=[keras.callbacks.SwapEMAWeights(swap_on_epoch=True)],
            ).history
        )
    assert_same_history(*histories)
    assert_same_weights(plain, towered)


@pytest.mark.parametrize("replicas", [False, True])
def test_discriminative_learning_rates_with_an_optimizer_map(replicas):
    # The replicas' copies were named `kernel`, `bias` without the layer's
    # path, so the clone's map sent every copy to the default optimizer:
    # "optimizer state shapes..." on the GPU default path.
    if not hasattr(keras.optimizers, "OptimizerMap"):
        pytest.skip(f"Keras {keras.__version__} has no OptimizerMap")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(29, 5)).astype("float32")
    y = np.tanh(x[:, :1])

    def optimizer():
        mapping = keras.optimizers.OptimizerMap(keras.optimizers.SGD(0.01))
        mapping["body/.*"] = keras.optimizers.Adam(0.003)
        return keras.optimizers.MultiOptimizer(mapping)

    def build(towers=None):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,))
        h = keras.layers.Dense(8, activation="tanh", name="body")(inputs)
        outputs = keras.layers.Dense(1, name="head")(h)
        if towers is None:
            return keras.Model(inputs, outputs)
        return kerastower.TowerModel(
            inputs, outputs, towers=towers, replicate_variables=replicas
        )

    plain, towered = build(), build(3)
    towered.set_weights(plain.get_weights())
    histories = []
    for model in (plain, towered):
        model.compile(optimizer=optimizer(), loss="mse")
        histories.append(
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        )
    assert_same_history(*histories)
    assert_same_weights(plain, towered)


class HalveKernelEachBatch(keras.callbacks.Callback):
    """Assigns a weight as every training batch begins (a hand-made
    constraint): the towers must all train from the assigned value."""

    def on_train_batch_begin(self, batch, logs=None):
        kernel = self.model.layers[1].kernel
        kernel.assign(kernel * 0.5)


class ShiftBiasEachEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        bias = self.model.layers[2].bias
        bias.assign(bias + 0.25)


@pytest.mark.parametrize("callback", [HalveKernelEachBatch, ShiftBiasEachEpoch])
@pytest.mark.parametrize("replicas", [False, True])
def test_weights_a_callback_assigns_during_training_reach_every_tower(
    callback, replicas
):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(29, 5)).astype("float32")
    y = np.tanh(x[:, :1])
    plain, towered = regressor(), regressor(3, replicate_variables=replicas)
    towered.set_weights(plain.get_weights())
    histories = []
    for model in (plain, towered):
        model.compile(optimizer="sgd", loss="mse")
        histories.append(
            model.fit(
                x,
                y,
                batch_size=8,
                epochs=2,
                shuffle=False,
                verbose=0,
                callbacks=[callback()],
            ).history
        )
    assert_same_history(*histories)
    assert_same_weights(plain, towered)


def float8_model(towers):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    model = kerastower.TowerModel(inputs, keras.layers.Dense(4)(h), towers=towers)
    model.quantize("float8")
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("replicas", [False, True])
def test_float8_training_is_refused_on_towers(replicas):
    # Summed over towers, each scale became N times one device's and each
    # amax history the towers' sum (1.4e5 off after one step, measured).
    x = np.random.default_rng(5).normal(size=(12, 8)).astype("float32")
    y = x[:, :4]
    model = float8_model(3)
    if replicas:
        model = kerastower.TowerModel.from_model(model, replicate_variables=True)
        model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match=r"overwrite_with_gradient.*towers=1"):
        model.fit(x, y, batch_size=6, verbose=0)
    one = float8_model(1)
    one.fit(x, y, batch_size=6, verbose=0)  # one tower trains as one device


def optional_input_model(towers):
    """keras.io's optional input: ``o`` is added when given, else left out."""
    keras.utils.set_random_seed(0)
    x = keras.Input((2,), name="x")
    o = keras.Input((2,), name="o", optional=True)

    class AddOptional(keras.layers.Layer):
        def call(self, x, o):
            return x if o is None else x + o

    outputs = keras.layers.Dense(2)(AddOptional()(x, o))
    if towers:
        return kerastower.TowerModel({"x": x, "o": o}, outputs, towers=towers)
    return keras.Model({"x": x, "o": o}, outputs)


@pytest.mark.parametrize("given", [False, True], ids=["none", "array"])
def test_an_optional_input_left_out_trains_as_keras_does(given):
    # Before the first step a functional TowerModel builds its compiled loss
    # from its graph's output specs; an input given as ``None`` has none, and
    # the model builds as Keras builds it.
    data = np.random.default_rng(0).normal(size=(6, 2)).astype("float32")
    x = {"x": data, "o": data[::-1].copy() if given else None}
    models = [optional_input_model(towers) for towers in (0, 4)]
    histories = []
    for model in models:
        model.compile(optimizer="sgd", loss="mse")
        histories.append(
            model.fit(x, data * 2, batch_size=6, epochs=2, verbose=0).history
        )
    assert_same_history(*histories)
    assert_same_weights(*models)
