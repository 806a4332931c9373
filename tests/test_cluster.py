"""`kerastower.cluster`: TF_CONFIG parsing, the chief rule and sharding."""

import json
import types

import numpy as np
import pytest
import tensorflow as tf

import kerastower
from kerastower.workers import cluster


def _set(monkeypatch, config):
    text = config if isinstance(config, str) else json.dumps(config)
    monkeypatch.setenv("TF_CONFIG", text)


def _config(cluster_spec, task_type, index):
    return {"cluster": cluster_spec, "task": {"type": task_type, "index": index}}


WITH_CHIEF = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "evaluator": ["e:1"]}
WITHOUT_CHIEF = {"worker": ["w0:1", "w1:1", "w2:1"]}


def test_no_tf_config_is_a_single_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.tf_config() is None
    assert cluster.num_workers() == 1
    assert cluster.worker_index() == 0
    assert cluster.is_chief() is True
    assert cluster.is_multi_worker() is False


@pytest.mark.parametrize("text", ["", "   ", "{}"])
def test_empty_tf_config_is_a_single_chief(monkeypatch, text):
    _set(monkeypatch, text)
    assert cluster.tf_config() is None
    assert cluster.is_chief() is True
    assert cluster.num_workers() == 1


@pytest.mark.parametrize(
    "spec, task_type, index, chief, worker_index",
    [
        (WITH_CHIEF, "chief", 0, True, 0),
        (WITH_CHIEF, "worker", 0, False, 1),
        (WITH_CHIEF, "worker", 1, False, 2),
        (WITHOUT_CHIEF, "worker", 0, True, 0),
        (WITHOUT_CHIEF, "worker", 1, False, 1),
        (WITHOUT_CHIEF, "worker", 2, False, 2),
    ],
)
def test_chief_rule_and_worker_index(
    monkeypatch, spec, task_type, index, chief, worker_index
):
    config = _config(spec, task_type, index)
    _set(monkeypatch, config)
    assert cluster.tf_config() == config
    assert cluster.is_chief() is chief
    assert cluster.worker_index() == worker_index
    # The chief and workers train; the evaluator does not.
    assert cluster.num_workers() == 3
    assert cluster.is_multi_worker() is True
    assert cluster.is_evaluator() is False


def test_the_evaluator_is_neither_a_worker_nor_multi_worker(monkeypatch):
    _set(monkeypatch, _config(WITH_CHIEF, "evaluator", 0))
    assert cluster.is_evaluator() is True
    assert cluster.is_chief() is False
    assert cluster.is_multi_worker() is False
    assert cluster.num_workers() == 3
    with pytest.raises(ValueError, match="Only chief and worker tasks.*'evaluator'"):
        cluster.worker_index()


def test_parameter_servers_are_refused_with_the_strategy_they_belong_to(monkeypatch):
    _set(monkeypatch, _config({"worker": ["w:1"], "ps": ["p:1"]}, "worker", 0))
    with pytest.raises(ValueError, match='names "ps" tasks.*ParameterServerStrategy'):
        cluster.is_multi_worker()


def test_one_worker_cluster_is_not_multi_worker(monkeypatch):
    _set(monkeypatch, _config({"worker": ["w:1"]}, "worker", 0))
    assert cluster.num_workers() == 1
    assert cluster.is_multi_worker() is False
    assert cluster.is_chief() is True


MALFORMED = [
    ("{not json", "must be valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('"worker"', "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), 'must have a "cluster"'),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), 'must have a "task"'),
    (json.dumps(_config({}, "worker", 0)), '"cluster" must be a non-empty object'),
    (json.dumps(_config(["a:1"], "worker", 0)), '"cluster" must be a non-empty'),
    (json.dumps(_config({"worker": "a:1"}, "worker", 0)), 'entry "worker" must be'),
    (json.dumps(_config({"worker": [1]}, "worker", 0)), 'entry "worker" must be'),
    (
        json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}),
        '"task" must be an object with "type" and "index"',
    ),
    (
        json.dumps({"cluster": {"worker": ["a:1"]}, "task": "worker"}),
        '"task" must be an object',
    ),
    (json.dumps(_config({"worker": ["a:1"]}, "chief", 0)), "task types \\['worker'\\]"),
    (json.dumps(_config({"worker": ["a:1"]}, 3, 0)), "got 3"),
    (json.dumps(_config({"worker": ["a:1", "b:1"]}, "worker", 2)), r"\[0, 2\)"),
    (json.dumps(_config({"worker": ["a:1", "b:1"]}, "worker", -1)), "got -1"),
    (json.dumps(_config({"worker": ["a:1"]}, "worker", "0")), "must be an integer"),
    (json.dumps(_config({"worker": ["a:1"]}, "worker", 0.0)), "must be an integer"),
    (json.dumps(_config({"worker": ["a:1"]}, "worker", True)), "must be an integer"),
    (
        json.dumps(_config({"chief": ["a:1", "b:1"]}, "chief", 0)),
        "at most one",
    ),
    (
        json.dumps(
            _config({"worker": ["a:1"], "evaluator": ["b:1", "c:1"]}, "worker", 0)
        ),
        'at most one "evaluator"',
    ),
]


@pytest.mark.parametrize("text, rule", MALFORMED)
def test_malformed_tf_config_names_the_rule_and_what_was_received(
    monkeypatch, text, rule
):
    _set(monkeypatch, text)
    for function in (
        cluster.tf_config,
        cluster.is_chief,
        cluster.num_workers,
        cluster.worker_index,
        cluster.is_multi_worker,
    ):
        with pytest.raises(ValueError, match=rule) as info:
            function()
        message = str(info.value)
        assert message.startswith("`TF_CONFIG`")
        assert f"Received: TF_CONFIG={text!r}" in message


def _strategy(should_checkpoint):
    return types.SimpleNamespace(
        extended=types.SimpleNamespace(should_checkpoint=should_checkpoint)
    )


@pytest.mark.parametrize(
    "config, should_checkpoint, expected",
    [
        (None, True, True),
        (None, False, False),  # a strategy built from another cluster resolver
        (_config(WITHOUT_CHIEF, "worker", 0), True, True),
        (_config(WITHOUT_CHIEF, "worker", 1), True, False),  # a one-worker strategy
        (_config(WITHOUT_CHIEF, "worker", 0), False, False),
    ],
)
def test_is_chief_needs_tf_config_and_strategy_to_agree(
    monkeypatch, config, should_checkpoint, expected
):
    if config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        _set(monkeypatch, config)
    assert cluster.is_chief(_strategy(should_checkpoint)) is expected


def test_is_chief_with_the_default_strategy_follows_tf_config(monkeypatch):
    strategy = tf.distribute.get_strategy()
    _set(monkeypatch, _config(WITHOUT_CHIEF, "worker", 1))
    assert cluster.is_chief(strategy) is False
    _set(monkeypatch, _config(WITHOUT_CHIEF, "worker", 0))
    assert cluster.is_chief(strategy) is True
    assert cluster.is_chief(object()) is True  # no `extended`: TF_CONFIG alone


def test_shard_arrays_keeps_every_nth_example():
    x = np.arange(20).reshape(10, 2)
    y = np.arange(10)
    x1, y1 = cluster.shard((x, y), num_workers=3, index=1)
    np.testing.assert_array_equal(y1, [1, 4, 7])
    np.testing.assert_array_equal(x1, [[2, 3], [8, 9], [14, 15]])
    sharded = cluster.shard({"a": y, "b": [y, None]}, num_workers=2, index=0)
    np.testing.assert_array_equal(sharded["a"], [0, 2, 4, 6, 8])
    np.testing.assert_array_equal(sharded["b"][0], [0, 2, 4, 6, 8])
    assert sharded["b"][1] is None


def test_shards_batched_per_worker_rebuild_the_global_batches():
    n, workers, global_batch = 24, 3, 6
    data = np.arange(n)
    shards = [cluster.shard(data, workers, i) for i in range(workers)]
    per_worker = global_batch // workers
    for step in range(n // global_batch):
        union = np.concatenate(
            [s[step * per_worker : (step + 1) * per_worker] for s in shards]
        )
        expected = data[step * global_batch : (step + 1) * global_batch]
        np.testing.assert_array_equal(np.sort(union), expected)


def test_shard_dataset_matches_shard_arrays():
    x = np.arange(11, dtype="float32")
    dataset = tf.data.Dataset.from_tensor_slices(x)
    for index in range(3):
        got = np.array(list(cluster.shard(dataset, 3, index).as_numpy_iterator()))
        np.testing.assert_array_equal(got, cluster.shard(x, 3, index))


def test_shard_defaults_come_from_tf_config(monkeypatch):
    x = np.arange(12)
    _set(monkeypatch, _config(WITH_CHIEF, "worker", 1))  # index 2 of 3
    np.testing.assert_array_equal(cluster.shard(x), [2, 5, 8, 11])
    monkeypatch.delenv("TF_CONFIG")
    np.testing.assert_array_equal(cluster.shard(x), x)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_workers": 0, "index": 0}, "`num_workers` must be an integer >= 1"),
        ({"num_workers": 2.0, "index": 0}, "Received: num_workers=2.0"),
        ({"num_workers": True, "index": 0}, "Received: num_workers=True"),
        ({"num_workers": 2, "index": 2}, r"`index` must be an integer in \[0, "),
        ({"num_workers": 2, "index": -1}, "Received: index=-1, num_workers=2"),
    ],
)
def test_shard_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cluster.shard(np.arange(4), **kwargs)


def test_shard_rejects_unknown_data():
    with pytest.raises(ValueError, match="Received: data of type set"):
        cluster.shard({1, 2}, 2, 0)


def test_top_level_exports():
    assert kerastower.is_chief is cluster.is_chief
    assert kerastower.num_workers is cluster.num_workers
    assert kerastower.worker_index is cluster.worker_index
    assert kerastower.is_multi_worker is cluster.is_multi_worker
    for name in ("is_chief", "num_workers", "worker_index", "is_multi_worker"):
        assert name in kerastower.__all__
