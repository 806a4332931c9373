"""Property: towers equal one device across model families, losses and optimizers.

Hypothesis draws a model family (dense, embeddings with or without a mask,
per-timestep LSTM and Conv1D taggers, BatchNormalization, a convolutional
stack with BatchNormalization, a multi-output dict, kernel constraints, kernel
and activity regularizers, sparse inputs, an in-batch contrastive loss), a
loss that fits it (mean, masked, ``ignore_class``, ``"sum"``, sample or class
weights), an optimizer (Adam and friends on sparse embedding gradients, AdamW
with exclusions from weight decay, a learning-rate schedule of the test's own
included), 1-4 towers and
batch sizes 1-33, so that uneven splits and batches smaller than the tower
count occur, with or without per-tower replicas (``replicate_variables``),
XLA (``jit_compile``, per tower) and the loss of the whole batch
(``global_batch_loss``, always with the contrastive loss). Weights, history,
evaluation and predictions must equal a plain `keras.Model` on one device.
"""

import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st
from keras_family import (
    KERAS_2,
    KERAS_MINOR,
    KERAS_VERSION,
    keras,
    keras3_only_until_ported,
)
from oracle import (
    assert_close,
    assert_same_history,
    assert_same_weights,
    plain_fit_data,
    twin,
)

LENGTH, VOCAB, CLASSES = 6, 12, 3


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule without `get_config`, not registered."""

    def __call__(self, step):
        step = tf.cast(step, "float32")
        return 0.02 * tf.minimum(1.0, (step + 1) / 3)


def adamw_excluding_biases():
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.2)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "adamw_exclusions": adamw_excluding_biases,
    "adam_schedule": lambda: keras.optimizers.Adam(Warmup()),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "rmsprop_clip": lambda: keras.optimizers.RMSprop(0.01, clipnorm=0.5),
    # Moving averages: `fit` ends by assigning them to the weights.
    "sgd_ema": lambda: keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=0.5),
}


def discriminative_rates():
    """Kernels on Adam, everything else on SGD: an `OptimizerMap` by path."""
    mapping = keras.optimizers.OptimizerMap(keras.optimizers.SGD(0.05))
    mapping[".*kernel"] = keras.optimizers.Adam(0.01)
    return keras.optimizers.MultiOptimizer(mapping)


if hasattr(keras.optimizers, "OptimizerMap"):  # Keras 3.13 and newer
    OPTIMIZERS["multi_optimizer_map"] = discriminative_rates


def tokens(rng, n, padded):
    x = rng.integers(1, VOCAB, size=(n, LENGTH))
    if padded:
        for row in range(n):
            x[row, rng.integers(1, LENGTH + 1) :] = 0
    return x


def dense(mask):
    inputs = keras.Input((5,))
    h = keras.layers.Dense(7, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(CLASSES)(h)


def regularized(mask):
    # Losses added in the forward pass: a batch-mean activity penalty (each
    # tower's shard) and a kernel penalty (once), with or without the
    # whole-batch loss.
    inputs = keras.Input((5,))
    h = keras.layers.Dense(
        7,
        activation="tanh",
        kernel_regularizer=keras.regularizers.L2(0.01),
        activity_regularizer=keras.regularizers.L1(0.01),
    )(inputs)
    return inputs, keras.layers.Dense(CLASSES)(h)


def embedding(mask):
    inputs = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 4, mask_zero=mask)(inputs)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return inputs, keras.layers.Dense(CLASSES)(h)


def lstm_tagger(mask):
    inputs = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 4, mask_zero=mask)(inputs)
    h = keras.layers.LSTM(5, return_sequences=True)(h)
    return inputs, keras.layers.Dense(CLASSES)(h)


def conv_tagger(mask):
    inputs = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 4)(inputs)
    h = keras.layers.Conv1D(5, 3, padding="same", activation="relu")(h)
    return inputs, keras.layers.Dense(CLASSES)(h)


def batch_norm(mask):
    inputs = keras.Input((5,))
    # No bias before BatchNormalization (as Keras's applications do): its
    # true gradient is 0, and Adam would scale rounding noise up to steps.
    h = keras.layers.Dense(6, use_bias=False)(inputs)
    h = keras.layers.BatchNormalization()(h)
    return inputs, keras.layers.Dense(CLASSES)(keras.layers.ReLU()(h))


def conv_stack(mask):
    inputs = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.MaxPooling2D(2)(keras.layers.ReLU()(h))
    h = keras.layers.SeparableConv2D(4, 2)(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return inputs, keras.layers.Dense(CLASSES)(h)


def multi_output(mask):
    inputs = keras.Input((5,))
    h = keras.layers.Dense(7, activation="tanh")(inputs)
    return inputs, {
        "score": keras.layers.Dense(1, name="score")(h),
        "label": keras.layers.Dense(CLASSES, name="label")(h),
    }


def constrained(mask):
    inputs = keras.Input((5,))
    h = keras.layers.Dense(
        7, activation="tanh", kernel_constraint=keras.constraints.NonNeg()
    )(inputs)
    return inputs, keras.layers.Dense(
        CLASSES, kernel_constraint=keras.constraints.MaxNorm(0.3)
    )(h)


def sparse(mask):
    inputs = keras.Input((5,), sparse=True)
    h = keras.layers.Dense(7, activation="tanh")(inputs)
    return inputs, keras.layers.Dense(CLASSES)(h)


# Keras 3.14's own `fit` fails on a sparse array whose last row has no entry
# (it counts the rows up to the last entry: "RaggedGather ... indices[0] = 2
# is not in [0, 2)" in its data adapter), one device too; Keras 3.15 fits it.
KERAS_FITS_EMPTY_LAST_ROWS = KERAS_2 or KERAS_MINOR >= (3, 15)


def sparse_rows(rng, n, mask):
    rows = rng.normal(size=(n, 5)) * (rng.uniform(size=(n, 5)) < 0.4)
    if not KERAS_FITS_EMPTY_LAST_ROWS and not rows[-1].any():
        rows[-1, 0] = 1.0
    return scipy.sparse.csr_matrix(rows.astype("float32"))


def in_batch_contrastive(y_true, y_pred):
    """Each example's targets are the other examples of the batch with its
    label (SimCLR- and CLIP-style in-batch negatives)."""
    z = y_pred / (tf.norm(y_pred, axis=1, keepdims=True) + 1e-6)
    logits = tf.matmul(z, tf.transpose(z)) / 0.5
    y_true = tf.reshape(tf.cast(y_true, "float32"), (-1, 1))
    same = tf.cast(tf.equal(y_true, tf.transpose(y_true)), "float32")
    targets = same / tf.reduce_sum(same, axis=1, keepdims=True)
    return keras.losses.categorical_crossentropy(targets, logits, from_logits=True)


# family: (build, inputs(rng, n, mask), per-timestep outputs)
FAMILIES = {
    "dense": (dense, lambda rng, n, m: rng.normal(size=(n, 5)), False),
    "regularized": (regularized, lambda rng, n, m: rng.normal(size=(n, 5)), False),
    "embedding": (embedding, tokens, False),
    "lstm_tagger": (lstm_tagger, tokens, True),
    "conv_tagger": (conv_tagger, tokens, True),
    "batch_norm": (batch_norm, lambda rng, n, m: rng.normal(size=(n, 5)), False),
    "conv_stack": (conv_stack, lambda rng, n, m: rng.normal(size=(n, 6, 6, 2)), False),
    "multi_output": (multi_output, lambda rng, n, m: rng.normal(size=(n, 5)), False),
    "constrained": (constrained, lambda rng, n, m: rng.normal(size=(n, 5)), False),
    "sparse": (sparse, sparse_rows, False),
    "contrastive": (dense, lambda rng, n, m: rng.normal(size=(n, 5)), False),
}
LOSSES = ["mean", "sum", "ignore_class", "sample_weight", "class_weight"]


def crossentropy(loss_kind):
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True,
        reduction="sum" if loss_kind == "sum" else "sum_over_batch_size",
        ignore_class=-1 if loss_kind == "ignore_class" else None,
    )


# Keras 3.10 to 3.13 cannot fit a sparse array (a batch without an entry
# fails in its data adapter, one device too; tests/step/test_sparse_inputs.py).
DRAWN = sorted(
    f for f in FAMILIES if f != "sparse" or KERAS_2 or KERAS_MINOR >= (3, 14)
)


@st.composite
def setups(draw):
    family = draw(st.sampled_from(DRAWN))
    loss_kind = draw(st.sampled_from(LOSSES))
    if loss_kind == "class_weight" and family in ("multi_output",) + tuple(
        f for f in FAMILIES if FAMILIES[f][2]
    ):
        loss_kind = "sample_weight"  # Keras: class_weight needs one 1-D target
    if family == "contrastive" and loss_kind not in ("mean", "sample_weight"):
        loss_kind = "mean"
    return dict(
        family=family,
        loss_kind=loss_kind,
        mask=draw(st.booleans()),
        optimizer=draw(st.sampled_from(sorted(OPTIMIZERS))),
        towers=draw(st.integers(1, 4)),
        batch_size=draw(st.integers(1, 33)),
        samples=draw(st.integers(1, 40)),
        seed=draw(st.integers(0, 2**16)),
        replicate_variables=not KERAS_2 and draw(st.booleans()),
        global_batch_loss=family == "contrastive" or draw(st.booleans()),
        # Keras cannot compile a sparse input's ops with XLA on one device.
        # The `keras` 2.12 to 2.15 of TensorFlow cannot compile an
        # `ignore_class` loss with XLA on one device either ("Fail to proof the
        # equality of two dimensions" in its `boolean_mask`, TensorFlow 2.12).
        jit_compile=family != "sparse"
        and draw(st.booleans())
        and not (loss_kind == "ignore_class" and KERAS_2 and KERAS_MINOR < (2, 16)),
    )


def data(setup):
    build, make_inputs, per_step = FAMILIES[setup["family"]]
    rng = np.random.default_rng(setup["seed"])
    n = setup["samples"]
    x = make_inputs(rng, n, setup["mask"])
    x = (
        x.astype("float32")
        if x.dtype.kind == "f" and not scipy.sparse.issparse(x)
        else x
    )
    shape = (n, LENGTH) if per_step else (n,)
    labels = rng.integers(0, CLASSES, size=shape)
    if setup["loss_kind"] == "ignore_class":
        labels = np.where(rng.uniform(size=shape) < 0.3, -1, labels)
    fit = {}
    if setup["loss_kind"] == "sample_weight":
        fit["sample_weight"] = rng.uniform(0.0, 2.0, size=shape).astype("float32")
    if setup["loss_kind"] == "class_weight":
        fit["class_weight"] = {0: 0.5, 1: 2.0, 2: 1.0}
    if setup["family"] == "multi_output":
        score = rng.normal(size=(n, 1)).astype("float32")
        labels = {"score": score, "label": labels}
        if "sample_weight" in fit:
            fit["sample_weight"] = {
                "score": fit["sample_weight"],
                "label": fit["sample_weight"],
            }
    return x, labels, fit


def compile_kwargs(setup):
    loss = crossentropy(setup["loss_kind"])
    metrics = ["accuracy"]
    if setup["family"] == "contrastive":
        loss, metrics = in_batch_contrastive, []
    if setup["family"] == "multi_output":
        score = keras.losses.MeanSquaredError(
            reduction="sum" if setup["loss_kind"] == "sum" else "sum_over_batch_size"
        )
        loss = {"score": score, "label": loss}
        metrics = {"score": ["mae"], "label": ["accuracy"]}
    return dict(
        optimizer=OPTIMIZERS[setup["optimizer"]](),
        loss=loss,
        metrics=metrics,
        jit_compile=setup["jit_compile"],
    )


@given(setups())
def test_model_families_match_one_device(setup):
    check_family(setup)


# A setup the drawn ones vary around, for the cases that must run.
FIXED = dict(
    loss_kind="mean",
    towers=3,
    batch_size=7,
    samples=20,
    seed=3,
    global_batch_loss=False,
)


@pytest.mark.parametrize(
    "family, optimizer",
    [("conv_stack", "sgd"), ("embedding", "adam"), ("lstm_tagger", "adam")],
)
@pytest.mark.parametrize(
    "replicate_variables",
    [False, pytest.param(True, marks=keras3_only_until_ported("replicas"))],
)
def test_xla_per_tower_matches_one_device(family, optimizer, replicate_variables):
    # Under XLA each tower's forward and backward pass is compiled on its
    # device (tests/step/test_xla_towers.py); one device compiles its step.
    check_family(
        FIXED
        | dict(
            family=family,
            mask=True,
            optimizer=optimizer,
            replicate_variables=replicate_variables,
            jit_compile=True,
        )
    )


def check_family(setup):
    """Fits, evaluates and predicts `setup` on towers and on one device."""
    x, y, fit = data(setup)
    build = FAMILIES[setup["family"]][0]

    def model():
        keras.utils.set_random_seed(setup["seed"] % 7)
        return keras.Model(*build(setup["mask"]))

    plain, towered = twin(
        model,
        setup["towers"],
        replicate_variables=setup["replicate_variables"],
        global_batch_loss=setup["global_batch_loss"],
    )
    fit |= dict(batch_size=setup["batch_size"], epochs=2, shuffle=False, verbose=0)
    histories = []
    for m, (xs, ys, kwargs) in (
        (plain, plain_fit_data(x, y, fit)),
        (towered, (x, y, fit)),
    ):
        m.compile(**compile_kwargs(setup))
        histories.append(m.fit(xs, ys, **kwargs).history)
    assert_same_history(*histories)
    assert_same_weights(plain, towered)
    batch = setup["batch_size"]
    expected = plain.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    got = towered.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    assert got.keys() == expected.keys()
    for key in expected:
        assert_close(got[key], expected[key], err_msg=key)
    predictions = [
        tf.nest.flatten(m.predict(x, batch_size=batch, verbose=0))
        for m in (plain, towered)
    ]
    for a, b in zip(*predictions, strict=True):
        assert_close(b, a)


@pytest.mark.parametrize(
    "optimizer",
    [
        "sgd_ema",
        pytest.param(
            "multi_optimizer_map",
            marks=pytest.mark.skipif(
                "multi_optimizer_map" not in OPTIMIZERS,
                reason=f"Keras {KERAS_VERSION} has no OptimizerMap",
            ),
        ),
    ],
)
@pytest.mark.parametrize(
    "replicate_variables",
    [False, pytest.param(True, marks=keras3_only_until_ported("replicas"))],
)
def test_every_optimizer_family_is_drawn(optimizer, replicate_variables):
    # The property draws 12 examples: these families run here whatever it draws.
    check_family(
        FIXED
        | dict(
            family="dense",
            mask=False,
            optimizer=optimizer,
            replicate_variables=replicate_variables,
            jit_compile=False,
        )
    )
