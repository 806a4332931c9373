"""`TowerModel` on JAX against one device: the same weights, history,
metrics and predictions for every batch size and the models Keras trains."""

import functools
import importlib

import jax
import keras
import numpy as np
import pytest
from jax_oracle import (
    assert_same,
    fit_both,
    float64,
    mlp,
    twin,
    weights_apart,
    yardstick,
)
from keras import ops

import kerastower


def _data(samples=30, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(samples, 5)), rng.normal(size=(samples, 1))


# 27 on 4 towers: every batch runs whole on each device; 8: sharded, with a
# last batch of 6 that is not; 1, 3, 5: smaller than or not a multiple of N.
@pytest.mark.parametrize("towers", [2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 3, 5, 8, 12, 27])
def test_fit_matches_one_device_for_any_batch_size(towers, batch_size):
    x, y = _data()
    with float64():
        plain, tower = twin(mlp, towers)
        histories = fit_both(plain, tower, x, y, batch_size=batch_size)
    assert tower.num_towers == towers
    assert_same(plain, tower, histories)


@pytest.mark.parametrize("batch_size", [3, 8])
def test_evaluate_and_predict_match_one_device_in_input_order(batch_size):
    x, y = _data(31)
    with float64():
        plain, tower = twin(mlp)
        fit_both(plain, tower, x, y, batch_size=8)
        predicted = tower.predict(x, batch_size=batch_size, verbose=0)
        expected = plain.predict(x, batch_size=batch_size, verbose=0)
        scores = [
            m.evaluate(x, y, batch_size=batch_size, verbose=0) for m in (plain, tower)
        ]
    assert predicted.shape == (31, 1)
    np.testing.assert_allclose(predicted, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scores[1], scores[0], rtol=1e-12, atol=1e-12)
    # In order: row i is the model's output for example i.
    np.testing.assert_allclose(predicted, np.asarray(tower(x)), rtol=1e-12, atol=1e-12)


def _bn_convnet(cls, **kwargs):
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.Conv2D(4, 3, activation="tanh")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    model = cls(inputs, keras.layers.Dense(3)(h), **kwargs)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_batch_normalization_uses_the_global_batch():
    # Rows sorted by their mean: each tower's shard has very different
    # moments from the batch's, so per-shard statistics would be far off.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6, 6, 1))
    x = (
        x[np.argsort(x.mean(axis=(1, 2, 3)))]
        + np.repeat(np.arange(4.0), 8)[:, None, None, None]
    )
    y = rng.integers(0, 3, (32,))
    with float64():
        plain, tower = twin(_bn_convnet)
        histories = fit_both(plain, tower, x, y, batch_size=8)
        drift = yardstick(_bn_convnet, x, y, batch_size=8)
    # Keras computes BatchNormalization in float32 on JAX, even in float64
    # (jax_oracle): measured here, towers 1.4e-7 apart where one device
    # against itself on reversed batches drifts 7.2e-8 (another model, same
    # scale); 8x that, floored at float32's 1e-6, is rounding, while
    # per-shard statistics move these weights by about 1e-1.
    bound = max(8 * drift, 1e-6)
    assert weights_apart(plain, tower) <= bound
    for key in histories[0]:
        np.testing.assert_allclose(
            histories[1][key], histories[0][key], rtol=1e-5, atol=1e-5
        )


def _masked_tagger(cls, **kwargs):
    inputs = keras.Input((7,), dtype="int32")
    h = keras.layers.Embedding(12, 4, mask_zero=True)(inputs)
    h = keras.layers.LSTM(5, return_sequences=True)(h)
    model = cls(inputs, keras.layers.Dense(3)(h), **kwargs)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@pytest.mark.parametrize("batch_size", [5, 8])
def test_masked_sequence_loss_matches_one_device(batch_size):
    # Padded sequences of every length: the masked mean divides by the
    # batch's valid steps, not each shard's.
    rng = np.random.default_rng(1)
    x = rng.integers(1, 12, (26, 7)).astype("int32")
    for i, length in enumerate(rng.integers(1, 8, 26)):
        x[i, length:] = 0
    y = rng.integers(0, 3, (26, 7))
    with float64():
        plain, tower = twin(_masked_tagger)
        histories = fit_both(plain, tower, x, y, batch_size=batch_size)
    assert_same(plain, tower, histories)


def _contrastive(y_true, y_pred):
    """Each example against every other of the batch (InfoNCE-like)."""
    logits = ops.matmul(y_pred, ops.transpose(y_pred))
    labels = ops.arange(ops.shape(y_pred)[0])
    return keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True
    )


def test_a_loss_over_the_whole_batch_needs_no_flag():
    x, _ = _data(24)
    with float64():
        plain, tower = twin(functools.partial(mlp, loss=_contrastive, metrics=()))
        histories = fit_both(plain, tower, x, np.zeros((24, 1)), batch_size=8)
    assert_same(plain, tower, histories)


def _two_heads(cls, **kwargs):
    image = keras.Input((5,), name="features")
    extra = keras.Input((2,), name="extra")
    h = keras.layers.Dense(6, activation="relu")(
        keras.layers.Concatenate()([image, extra])
    )
    score = keras.layers.Dense(1, name="score")(h)
    label = keras.layers.Dense(3, name="label")(h)
    model = cls([image, extra], {"score": score, "label": label}, **kwargs)
    model.compile(
        optimizer=keras.optimizers.RMSprop(0.01),
        loss={
            "score": "mse",
            "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        },
        loss_weights={"score": 0.3, "label": 1.0},
        metrics={"label": ["accuracy"], "score": ["mae"]},
    )
    return model


def test_multi_input_multi_output_with_sample_weights():
    rng = np.random.default_rng(2)
    x = {"features": rng.normal(size=(22, 5)), "extra": rng.normal(size=(22, 2))}
    y = {"score": rng.normal(size=(22, 1)), "label": rng.integers(0, 3, (22,))}
    weights = rng.uniform(0, 2, (22,))
    with float64():
        plain, tower = twin(_two_heads)
        histories = fit_both(plain, tower, x, y, batch_size=8, sample_weight=weights)
    assert_same(plain, tower, histories)


def test_class_weight_matches_one_device():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(20, 5)), rng.integers(0, 2, (20, 1))
    build = functools.partial(mlp, loss="binary_crossentropy", metrics=("accuracy",))
    with float64():
        plain, tower = twin(build)
        histories = fit_both(
            plain, tower, x, y, batch_size=4, class_weight={0: 0.3, 1: 2.0}
        )
    assert_same(plain, tower, histories)


class _Penalised:
    """A `compute_loss` of its own: the output's mean square added."""

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        # A sum, not `ops.mean`: Keras's mean runs in float32 on JAX even for
        # float64 (jax_oracle), on one device as on towers.
        squares = ops.sum(ops.square(y_pred))
        return loss + 0.1 * squares / ops.cast(ops.size(y_pred), squares.dtype)


class _CountedStep:
    """A `train_step` of its own (Keras's JAX form), counting its traces."""

    traces = {"plain": 0, "towers": 0}

    def train_step(self, state, data):
        # Runs when JAX traces the step, not at every step.
        towers = isinstance(self, kerastower.TowerModel)
        self.traces["towers" if towers else "plain"] += 1
        return super().train_step(state, data)


@pytest.mark.parametrize("mixin", [_Penalised, _CountedStep])
def test_subclasses_with_their_own_loss_or_step(mixin):
    plain_cls = type("Plain", (mixin, keras.Model), {})
    tower_cls = type("Towered", (mixin, kerastower.TowerModel), {})
    x, y = _data(30)

    def build(cls, **kwargs):
        return mlp(plain_cls if cls is keras.Model else tower_cls, **kwargs)

    with float64():
        plain, tower = twin(build)
        histories = fit_both(plain, tower, x, y, batch_size=8, epochs=3)
    assert isinstance(tower, tower_cls)
    assert_same(plain, tower, histories)
    if mixin is _CountedStep:
        # Two batch shapes (8, and the last 6): two compilations each, in
        # three epochs, for one device and for the towers alike.
        assert _CountedStep.traces == {"plain": 2, "towers": 2}


class _ShardingProbe(keras.layers.Layer):
    """Records how its input is laid out over the devices when compiled."""

    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self.record = record  # a function: Keras would copy a list it tracks

    def call(self, inputs):
        jax.debug.inspect_array_sharding(inputs, callback=self.record)
        return inputs


def test_divisible_batches_are_sharded_and_others_replicated():
    seen = []
    inputs = keras.Input((5,))
    outputs = keras.layers.Dense(1)(_ShardingProbe(seen.append)(inputs))
    model = kerastower.TowerModel(inputs, outputs, towers=4)
    model.compile(optimizer="sgd", loss="mse")
    x, y = _data(30)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # 8, 8, 8 and 6
    assert len(seen) == 2
    shards = [s.shard_shape((8, 5)) for s in seen[:1]] + [
        s.shard_shape((6, 5)) for s in seen[1:]
    ]
    assert shards == [(2, 5), (6, 5)]
    assert not seen[0].is_fully_replicated and seen[1].is_fully_replicated


def test_saved_model_loads_as_a_tower_model(tmp_path):
    x, y = _data(12)
    with float64():
        model = mlp(kerastower.TowerModel, towers=2)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        path = tmp_path / "model.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
    assert isinstance(loaded, kerastower.TowerModel)
    assert loaded.tower_devices == ["cpu:0", "cpu:1"]
    assert weights_apart(model, loaded) == 0.0
    plain = keras.Model(model.inputs, model.outputs)
    assert isinstance(
        kerastower.TowerModel.from_model(plain, towers=3), kerastower.TowerModel
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"towers": 0}, "`towers` must be an integer >= 1. Received: towers=0"),
        ({"towers": 5}, "at most the number of available devices"),
        ({"towers": ["gpu:7"]}, "names a device that does not exist: 'gpu:7'"),
        ({"towers": ["cpu:1", "/device:CPU:1"]}, "must not name a device twice"),
        ({"sync_batch_norm": False}, "Received: sync_batch_norm=False"),
        ({"strategy": object()}, "`strategy` must be left at its default"),
        ({"replicate_variables": False}, "Received: replicate_variables=False"),
        ({"all_reduce": {"bucket_bytes": 1}}, "`all_reduce` must be left"),
    ],
)
def test_bad_arguments_are_refused_keras_style(kwargs, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace("[", r"\[")
    ):
        mlp(kerastower.TowerModel, **kwargs)


def test_tensorflow_only_names_say_so():
    with pytest.raises(AttributeError, match="runs on Keras's TensorFlow backend"):
        kerastower.TowerStrategy  # noqa: B018
    with pytest.raises(ImportError, match="TensorFlow backend"):
        importlib.import_module("kerastower.callbacks")


def test_weights_assigned_between_fits_are_used():
    # One variable assigned from NumPy lives on one device, uncommitted,
    # beside the others replicated on the towers: the next step takes it.
    x, y = _data(16)
    with float64():
        plain, tower = twin(mlp)
        fit_both(plain, tower, x, y, batch_size=8, epochs=1)
        for model in (plain, tower):
            model.layers[-1].kernel.assign(np.full((7, 1), 0.5))
        histories = fit_both(plain, tower, x, y, batch_size=8)
    assert_same(plain, tower, histories)
