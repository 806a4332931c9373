"""Every row of docs/guides/bad-inputs.md: a bad input and what the user gets.

`ERRORS` maps a row's id to the call that passes the bad input, the error
type and a regex of its message. Inputs that are not refused have their own
tests below, which compare against a one-device `keras.Model`.
`test_the_table_lists_every_case` keeps the page and this file in step.
"""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import assert_close, assert_same_weights, mlp, regression_data, twin

import kerastower
from kerastower.callbacks import BatchScaling, ChiefCheckpoint, GradientAccumulation

TABLE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "bad-inputs.md"
X, Y = regression_data(n=16)
FIT = dict(batch_size=4, shuffle=False, verbose=0)


def model(towers=2, optimizer="adam"):
    towered = kerastower.TowerModel.from_model(mlp(), towers=towers)
    towered.compile(optimizer=optimizer, loss="mse")
    return towered


class Subclassed(keras.Model):
    def call(self, x):
        return x


class OwnStep(keras.Model):
    def train_step(self, data):
        return {}


def own_step_model():
    inputs = keras.Input((5,))
    return OwnStep(inputs, keras.layers.Dense(1)(inputs))


def tf_config(text):
    """Builds a TowerModel (no training) with `TF_CONFIG` set to `text`."""

    def build(monkeypatch, tmp_path):
        monkeypatch.setenv("TF_CONFIG", text)
        kerastower.TowerModel.from_model(mlp(), towers=2)

    return build


def fit_with(callback, x=X, y=Y, **kwargs):
    return lambda monkeypatch, tmp_path: model().fit(
        x, y, callbacks=[callback], **{**FIT, **kwargs}
    )


def unsized_batches():
    """A generator: `fit` cannot know the number of steps per epoch."""
    for start in range(0, 16, 4):
        yield X[start : start + 4], Y[start : start + 4]


def under_a_file(tmp_path):
    (tmp_path / "a_file").write_text("")
    return tmp_path / "a_file" / "ckpt" / "{epoch}.keras"


WORKERS = '"cluster": {"worker": ["a:1", "b:1"]}'

# id: (call(monkeypatch, tmp_path), error type, regex of the message)
ERRORS = {
    # TowerModel
    "towers-zero": (
        lambda mp, tp: kerastower.TowerModel.from_model(mlp(), towers=0),
        ValueError,
        r"`towers` must be an integer >= 1\. Received: towers=0",
    ),
    "towers-too-many": (
        lambda mp, tp: kerastower.TowerModel.from_model(mlp(), towers=99),
        ValueError,
        r"`towers` must be at most the number of available devices \(4: .*\)\. "
        r"Received: towers=99",
    ),
    "towers-string": (
        lambda mp, tp: kerastower.TowerModel.from_model(mlp(), towers="2"),
        ValueError,
        r"`towers` must be None, an integer >= 1 or a list of device names\. "
        r"Received: towers='2'",
    ),
    "towers-empty-list": (
        lambda mp, tp: kerastower.TowerModel.from_model(mlp(), towers=[]),
        ValueError,
        r"`towers` as a list must hold one or more device names\. "
        r"Received: towers=\[\]",
    ),
    "towers-unknown-device": (
        lambda mp, tp: kerastower.TowerModel.from_model(mlp(), towers=["GPU:0"]),
        ValueError,
        r"`towers` names a device that does not exist: 'GPU:0'\. Available: ",
    ),
    "towers-same-device-twice": (
        lambda mp, tp: kerastower.TowerModel.from_model(
            mlp(), towers=["CPU:0", "/device:CPU:0"]
        ),
        ValueError,
        r"`towers` must not name a device twice",
    ),
    "strategy-not-a-strategy": (
        lambda mp, tp: kerastower.TowerModel.from_model(
            mlp(), towers=2, strategy="mirrored"
        ),
        ValueError,
        r"`strategy` must be a tf\.distribute\.Strategy \(such as "
        r"MultiWorkerMirroredStrategy\) or None\. "
        r"Received: strategy='mirrored'",
    ),
    "strategy-one-machine": (
        lambda mp, tp: kerastower.TowerModel.from_model(
            mlp(), towers=2, strategy=tf.distribute.MirroredStrategy(["CPU:0"])
        ),
        ValueError,
        r"`strategy` is the strategy of the workers that train together, a "
        r"tf\.distribute\.MultiWorkerMirroredStrategy; the devices of this "
        r"machine are `towers` \(for `MirroredStrategy\(devices=\[\.\.\.\]\)`, "
        r"pass `towers=\[\.\.\.\]`\)\. Received: strategy=MirroredStrategy",
    ),
    "data-distributed-dataset": (
        lambda mp, tp: model().fit(
            tf.distribute.MirroredStrategy(["CPU:0"]).experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
            )
        ),
        ValueError,
        r"`x` must be the tf\.data\.Dataset itself, not a tf\.distribute "
        r"dataset: TowerModel splits each batch over its towers \(drop "
        r"`strategy\.experimental_distribute_dataset` and "
        r"`distribute_datasets_from_function`\)\. Received: x=DistributedDataset",
    ),
    "from-model-not-a-model": (
        lambda mp, tp: kerastower.TowerModel.from_model("model.keras", towers=2),
        ValueError,
        r"`model` must be a keras\.Model\. Received: model=str",
    ),
    "from-model-subclassed": (
        lambda mp, tp: kerastower.TowerModel.from_model(Subclassed(), towers=2),
        ValueError,
        r"`model` must be a built functional or Sequential model; subclassed models "
        r"should subclass TowerModel instead",
    ),
    "from-model-own-train-step": (
        lambda mp, tp: kerastower.TowerModel.from_model(own_step_model(), towers=2),
        ValueError,
        r"`TowerModel.from_model` reuses the layers of `model` but not its class, "
        r"which defines OwnStep\.train_step: training would ignore them\. "
        r"Subclass TowerModel instead",
    ),
    "optimizer-gradient-accumulation-steps": (
        lambda mp, tp: model(
            optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2)
        ).fit(X, Y, **FIT),
        ValueError,
        r"TowerModel does not support the optimizer's own "
        r"`gradient_accumulation_steps`.*GradientAccumulation\(steps\)",
    ),
    "fit-before-compile": (
        lambda mp, tp: kerastower.TowerModel.from_model(mlp(), towers=2).fit(
            X, Y, **FIT
        ),
        ValueError,
        r"You must call `compile\(\)` before using the model",
    ),
    # configure_logical_devices
    "devices-zero": (
        lambda mp, tp: kerastower.configure_logical_devices(0),
        ValueError,
        r"`n` must be an integer >= 1\. Received: n=0",
    ),
    "devices-unknown-type": (
        lambda mp, tp: kerastower.configure_logical_devices(2, "TPU"),
        ValueError,
        r"`device_type` must be 'CPU' or 'GPU'\. Received: device_type='TPU'",
    ),
    "devices-after-runtime-started": (
        lambda mp, tp: kerastower.configure_logical_devices(2),
        ValueError,
        r"Cannot configure 2 logical CPU devices: the TensorFlow runtime is already "
        r"initialised with 4 .*Call `configure_logical_devices` before any "
        r"TensorFlow operation",
    ),
    # GradientAccumulation
    "accumulation-steps-zero": (
        lambda mp, tp: GradientAccumulation(0),
        ValueError,
        r"`steps` must be an integer >= 1 or a dict \{epoch: steps\}\. "
        r"Received: steps=0",
    ),
    "accumulation-negative-epoch": (
        lambda mp, tp: GradientAccumulation({-1: 2}),
        ValueError,
        r"`steps` dict keys must be epochs, integers >= 0\. Received: steps=\{-1: 2\}",
    ),
    "accumulation-epoch-end": (
        lambda mp, tp: GradientAccumulation(2, epoch_end="drop"),
        ValueError,
        r"`epoch_end` must be one of \('apply', 'carry'\)\. Received: epoch_end='drop'",
    ),
    "accumulation-plain-model": (
        lambda mp, tp: (
            lambda plain: (
                plain.compile(optimizer="adam", loss="mse"),
                plain.fit(X, Y, callbacks=[GradientAccumulation(2)], **FIT),
            )
        )(mlp()),
        ValueError,
        r"GradientAccumulation needs a kerastower\.TowerModel\. "
        r"Received: model of type Functional",
    ),
    # BatchScaling and batch sizes
    "scaling-batch-zero": (
        lambda mp, tp: BatchScaling(0, 0.1, 32),
        ValueError,
        r"`per_tower_batch_size` must be an integer >= 1\. "
        r"Received: per_tower_batch_size=0",
    ),
    "scaling-learning-rate-nan": (
        lambda mp, tp: BatchScaling(8, float("nan"), 32),
        ValueError,
        r"`base_learning_rate` must be a finite number > 0\. "
        r"Received: base_learning_rate=nan",
    ),
    "scaling-rule": (
        lambda mp, tp: BatchScaling(8, 0.1, 32, rule="cubic"),
        ValueError,
        r"`rule` must be one of 'linear', 'sqrt'\. Received: rule='cubic'",
    ),
    "scaling-wrong-fit-batch": (
        fit_with(BatchScaling(8, 0.1, 32)),
        ValueError,
        r"`BatchScaling` expects global batches of 16 examples "
        r"\(per_tower_batch_size=8 x 2 towers x 1 workers\), but the first batch "
        r"had 4 examples",
    ),
    "scaling-warmup-unknown-steps": (
        lambda mp, tp: model().fit(
            unsized_batches(),
            verbose=0,
            shuffle=False,
            callbacks=[BatchScaling(2, 0.1, 32, warmup_epochs=1)],
        ),
        ValueError,
        r"`BatchScaling` with warmup needs the number of steps per epoch.*"
        r"pass `steps_per_epoch` to `fit`",
    ),
    "global-batch-zero": (
        lambda mp, tp: kerastower.global_batch_size(0, 2),
        ValueError,
        r"`per_tower_batch_size` must be an integer >= 1\. "
        r"Received: per_tower_batch_size=0",
    ),
    "global-batch-not-a-model": (
        lambda mp, tp: kerastower.global_batch_size(32, "model"),
        ValueError,
        r"`towers_or_model` must be an integer >= 1 or a model\. "
        r"Received: towers_or_model='model'",
    ),
    "batch-for-towers-array": (
        lambda mp, tp: kerastower.batch_for_towers(X, 4, 2),
        ValueError,
        r"`dataset` must be a tf\.data\.Dataset\. Received: dataset=ndarray",
    ),
    # ChiefCheckpoint
    "checkpoint-suffix": (
        lambda mp, tp: ChiefCheckpoint("ckpt.txt"),
        ValueError,
        r"The filepath provided must end in `\.keras`.*Received: filepath=ckpt\.txt",
    ),
    "checkpoint-resume-without-epoch": (
        lambda mp, tp: ChiefCheckpoint("last.keras", resume=True),
        ValueError,
        r"`resume=True` needs an `\{epoch\}` field in the file name of `filepath`",
    ),
    "checkpoint-unwritable-directory": (
        lambda mp, tp: model().fit(
            X, Y, callbacks=[ChiefCheckpoint(under_a_file(tp))], **FIT
        ),
        OSError,
        r"ChiefCheckpoint cannot write to the checkpoint directory '.*a_file/ckpt'",
    ),
    "checkpoint-path-is-a-directory": (
        lambda mp, tp: (
            (tp / "m.keras").mkdir(),
            model().fit(X, Y, callbacks=[ChiefCheckpoint(tp / "m.keras")], **FIT),
        ),
        IsADirectoryError,
        r"Please specify a non-directory filepath for ChiefCheckpoint",
    ),
    # TF_CONFIG and the cluster
    "tf-config-bad-json": (
        tf_config("{cluster: }"),
        ValueError,
        r"`TF_CONFIG` must be valid JSON \(.*\)\. Received: TF_CONFIG='\{cluster: \}'",
    ),
    "tf-config-missing-task": (
        tf_config("{" + WORKERS + "}"),
        ValueError,
        r'`TF_CONFIG` must have a "task" entry\. Received: TF_CONFIG=',
    ),
    "tf-config-index-out-of-range": (
        tf_config("{" + WORKERS + ', "task": {"type": "worker", "index": 2}}'),
        ValueError,
        r'`TF_CONFIG` "task" index must be in \[0, 2\) for the 2 "worker" task\(s\); '
        r"got 2",
    ),
    "tf-config-parameter-servers": (
        tf_config(
            '{"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, '
            '"task": {"type": "worker", "index": 0}}'
        ),
        ValueError,
        r'`TF_CONFIG` names "ps" tasks: parameter servers are for '
        r"`tf.distribute.ParameterServerStrategy`, which kerastower does not use",
    ),
    "tf-config-unknown-task-type": (
        tf_config("{" + WORKERS + ', "task": {"type": "ps", "index": 0}}'),
        ValueError,
        r"`TF_CONFIG` \"task\" type must be one of the cluster's task types "
        r"\['worker'\]; got 'ps'",
    ),
    "tf-config-two-chiefs": (
        tf_config(
            '{"cluster": {"chief": ["a:1", "b:1"]}, '
            '"task": {"type": "chief", "index": 0}}'
        ),
        ValueError,
        r'`TF_CONFIG` "cluster" may have at most one "chief"',
    ),
    "shard-index-out-of-range": (
        lambda mp, tp: kerastower.cluster.shard(X, num_workers=2, index=2),
        ValueError,
        r"`index` must be an integer in \[0, num_workers\)\. "
        r"Received: index=2, num_workers=2",
    ),
    "worker-timeout-zero": (
        lambda mp, tp: kerastower.worker_strategy(timeout_seconds=0),
        ValueError,
        r"`timeout_seconds` must be > 0 or None\. Received: timeout_seconds=0",
    ),
    # Data
    "data-x-y-lengths-differ": (
        lambda mp, tp: model().fit(X, Y[:10], **FIT),
        ValueError,
        r"Data cardinality is ambiguous",
    ),
    "data-sample-weight-length": (
        lambda mp, tp: model().fit(X, Y, sample_weight=np.ones(10), **FIT),
        ValueError,
        r"Data cardinality is ambiguous",
    ),
    "data-wrong-feature-shape": (
        lambda mp, tp: model().fit(np.zeros((16, 3), "float32"), Y, **FIT),
        ValueError,
        r"is incompatible with the layer: expected shape=\(None, 5\), "
        r"found shape=\(\d+, 3\)",
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_bad_input_gets_a_clear_error(case, monkeypatch, tmp_path):
    if case == "towers-unknown-device" and tf.config.list_logical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    call, error, message = ERRORS[case]
    with pytest.raises(error, match=message):
        call(monkeypatch, tmp_path)


QUIET = {}  # id: test, for the rows that are not errors


def quiet(case):
    def register(test):
        QUIET[case] = test
        return test

    return register


@quiet("data-y-extra-columns")
def test_data_y_with_more_columns_than_outputs_broadcasts_as_keras_does():
    y = np.repeat(Y, 3, axis=1) + np.arange(3, dtype="float32")  # (16, 3) vs (16, 1)
    plain, towered = twin(mlp, 2)
    for m in (plain, towered):
        m.compile(optimizer="sgd", loss="mse")
    expected = plain.fit(X, y, **FIT).history["loss"]
    assert_close(towered.fit(X, y, **FIT).history["loss"], expected)


@quiet("data-batch-size-zero")
def test_data_batch_size_zero_means_the_keras_default():
    plain, towered = twin(mlp, 2)
    for m in (plain, towered):
        m.compile(optimizer="sgd", loss="mse")
    expected = plain.fit(X, Y, **{**FIT, "batch_size": 0}).history["loss"]
    assert_close(
        towered.fit(X, Y, **{**FIT, "batch_size": 0}).history["loss"], expected
    )
    assert int(towered.optimizer.iterations) == 1  # one batch of up to 32


@quiet("subclass-overrides-train-step")
def test_subclass_overriding_train_step_is_warned():
    class Custom(kerastower.TowerModel):
        def __init__(self):
            super().__init__(towers=2)
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            return super().train_step(data)

    with pytest.warns(UserWarning, match="overrides `train_step`, so its training"):
        Custom()


@quiet("data-empty")
def test_data_empty_warns_and_returns_an_empty_history_as_keras_does():
    plain, towered = twin(mlp, 2)
    for m in (plain, towered):
        m.compile(optimizer="sgd", loss="mse")
    histories = []
    for m in (plain, towered):
        with pytest.warns(UserWarning, match="ran out of data"):
            histories.append(m.fit(X[:0], Y[:0], **FIT).history)
    assert histories[0] == histories[1] == {}
    # Keras counts one optimizer step here: the graph increments `iterations`
    # before the empty iterator stops the step. So do towers reading the
    # model's variables; with replicas the increment waits for the ring, and
    # the step stops first (KERASTOWER_REPLICATE_VARIABLES=1).
    counted = 0 if towered._tower_step.replicas is not None else 1
    assert int(plain.optimizer.iterations) == 1
    assert int(towered.optimizer.iterations) == counted
    assert_same_weights(plain, towered, rtol=0, atol=0)


def test_the_table_lists_every_case():
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", TABLE.read_text(), flags=re.M)
    assert len(rows) == len(set(rows)), "a row id appears twice"
    assert sorted(rows) == sorted([*ERRORS, *QUIET])
    assert len(rows) >= 15


def test_the_pages_count_the_cases_as_the_tests_do():
    counts = (len(ERRORS) + len(QUIET), len(ERRORS), len(QUIET))
    table = re.search(
        r"(\d+) inputs are listed: (\d+) raise an\s+error, (\d+) do not",
        TABLE.read_text(),
    )
    assert table, "bad-inputs.md no longer states its counts"
    assert tuple(map(int, table.groups())) == counts
    reliability = (TABLE.parent / "reliability.md").read_text()
    summary = re.search(
        r"lists (\d+) bad inputs.*?(\d+) raise an error and (\d+) are accepted",
        " ".join(reliability.split()),
    )
    assert summary, "reliability.md no longer states the bad-inputs counts"
    assert tuple(map(int, summary.groups())) == counts
