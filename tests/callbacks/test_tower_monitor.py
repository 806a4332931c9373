"""TowerMonitor: the values it logs are the exact counts, read back from TensorBoard."""

import json

import numpy as np
import pytest
import tensorflow as tf
from keras_family import KERAS_2, keras
from oracle import KERAS_MINOR, mlp, regression_data
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import kerastower
from kerastower.callbacks import TowerMonitor
from kerastower.callbacks.tower_monitor import execution_batch_sizes, tower_examples


def read_scalars(run_dir):
    """Returns {tag: [(step, value), ...]} from the event files of one run."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {
        tag: [
            (e.step, float(tf.make_ndarray(e.tensor_proto)))
            for e in events.Tensors(tag)
        ]
        for tag in events.Tags()["tensors"]
    }


def fit(model, x, y, monitor, batch_size, epochs=1, **compile_kwargs):
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", **compile_kwargs)
    return model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[monitor],
    )


def test_execution_batch_sizes():
    assert execution_batch_sizes(30, 1) == [30]
    assert execution_batch_sizes(20, 2) == [10, 10]
    assert execution_batch_sizes(87, 3, full_batch_size=30) == [30, 30, 27]
    assert execution_batch_sizes(3, 2, full_batch_size=5) == [3]  # data ran out
    assert execution_batch_sizes(7, 3) == [3, 3, 1]
    assert execution_batch_sizes(40, 1, full_batch_size=30) == [40]
    assert execution_batch_sizes(0, 2) == []
    with pytest.raises(ValueError, match="`steps` must be an integer >= 1"):
        execution_batch_sizes(3, 0)
    with pytest.raises(ValueError, match="`examples` must be an integer >= 0"):
        execution_batch_sizes(-1, 1)


def test_tower_examples_sums_each_towers_shares():
    # split_sizes(10, 3) = [4, 3, 3]; split_sizes(7, 3) = [3, 2, 2]
    assert tower_examples([10, 10, 7], 3) == [11, 8, 8]
    assert tower_examples([1], 4) == [1, 0, 0, 0]
    assert tower_examples([], 2) == [0, 0]


def test_log_dir_must_be_a_path():
    with pytest.raises(ValueError, match="`log_dir` must be None or a path"):
        TowerMonitor(log_dir=3)


def test_values_for_batch_10_on_3_towers_are_exact_and_written(tmp_path):
    x, y = regression_data(n=23)  # batches of 10, 10 and 3
    model = kerastower.TowerModel.from_model(mlp(), towers=3)
    monitor = TowerMonitor(tmp_path)
    history = fit(model, x, y, monitor, batch_size=10, epochs=2)

    assert len(monitor.history) == 2
    for epoch, record in enumerate(monitor.history):
        assert record["epoch"] == epoch
        assert record["examples"] == 23
        assert record["steps"] == 3
        assert record["global_batch_size"] == 10
        assert record["per_tower_batch_size"] == [4, 3, 3]
        # [4, 3, 3] + [4, 3, 3] + [1, 1, 1]
        assert record["tower_examples"] == [9, 7, 7]
        assert record["imbalance"] == pytest.approx(9 / (23 / 3) - 1)
        assert record["learning_rate"] == pytest.approx(0.05)
        assert record["examples_per_second"] == pytest.approx(23 / record["seconds"])
        assert record["step_time"] == pytest.approx(record["seconds"] / 3)
        assert "peak_memory_mb" not in record  # CPUs: no memory statistics
    np.testing.assert_allclose(
        history.history["examples_per_second"],
        [r["examples_per_second"] for r in monitor.history],
        rtol=1e-12,  # the same float64 numbers, logged twice: only exact copies pass
    )

    run = read_scalars(tmp_path / "towers")
    assert run["towers/examples"] == [(0, 23.0), (1, 23.0)]
    assert run["towers/steps"] == [(0, 3.0), (1, 3.0)]
    assert run["towers/global_batch_size"] == [(0, 10.0), (1, 10.0)]
    for epoch, record in enumerate(monitor.history):
        assert run["towers/examples_per_second"][epoch][1] == pytest.approx(
            record["examples_per_second"], rel=1e-6
        )
        assert run["towers/step_time_ms"][epoch][1] == pytest.approx(
            record["step_time"] * 1000, rel=1e-6
        )
        assert run["towers/learning_rate"][epoch][1] == pytest.approx(0.05)
    for i, (share, total) in enumerate(zip([4, 3, 3], [9, 7, 7])):
        tower = read_scalars(tmp_path / "towers" / f"tower_{i}")
        assert tower["tower/batch_size"] == [(0, share), (1, share)]
        assert tower["tower/examples"] == [(0, total), (1, total)]


def test_steps_per_execution_still_counts_every_step(tmp_path):
    x, y = regression_data(n=23)  # batches 5, 5, 5, 5, 3 in executions of 2
    model = kerastower.TowerModel.from_model(mlp(), towers=3)
    monitor = TowerMonitor()
    if not KERAS_2 and KERAS_MINOR < (3, 11):  # told only an execution's start
        with pytest.raises(ValueError, match=r"Keras 3.11 and newer do"):
            fit(model, x, y, monitor, batch_size=5, steps_per_execution=2)
        return
    fit(model, x, y, monitor, batch_size=5, steps_per_execution=2)
    (record,) = monitor.history
    assert record["examples"] == 23
    assert record["steps"] == 5
    assert record["per_tower_batch_size"] == [2, 2, 1]
    # 4 x [2, 2, 1] + [1, 1, 1]
    assert record["tower_examples"] == [9, 9, 5]


def test_a_global_batch_smaller_than_the_tower_count():
    x, y = regression_data(n=6)
    model = kerastower.TowerModel.from_model(mlp(), towers=4)
    monitor = TowerMonitor()
    fit(model, x, y, monitor, batch_size=2)
    (record,) = monitor.history
    assert record["per_tower_batch_size"] == [1, 1, 0, 0]
    assert record["tower_examples"] == [3, 3, 0, 0]
    assert record["imbalance"] == pytest.approx(3 / 1.5 - 1)


def test_plain_model_is_one_tower_and_no_log_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = regression_data(n=23)
    monitor = TowerMonitor()
    fit(mlp(), x, y, monitor, batch_size=8)
    (record,) = monitor.history
    assert record["per_tower_batch_size"] == [8]
    assert record["tower_examples"] == [23]
    assert record["imbalance"] == 0.0
    assert list(tmp_path.iterdir()) == []


def test_a_worker_that_is_not_chief_writes_under_its_own_directory(
    tmp_path, monkeypatch
):
    config = {
        "cluster": {"worker": ["host0:2222", "host1:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert TowerMonitor(tmp_path).run_dir == str(tmp_path / "worker_1")
    monkeypatch.delenv("TF_CONFIG")
    assert TowerMonitor(tmp_path).run_dir == str(tmp_path)


def test_several_workers_log_cluster_totals_without_per_tower_guesses(tmp_path):
    class TwoWorkerModel(keras.Model):
        num_towers = 2
        num_workers = 2  # as a TowerModel in a two-worker cluster reports

    x, y = regression_data(n=23)
    base = mlp()
    model = TwoWorkerModel(base.inputs, base.outputs)
    monitor = TowerMonitor(tmp_path)
    fit(model, x, y, monitor, batch_size=10)
    (record,) = monitor.history
    assert record["examples"] == 23
    assert record["global_batch_size"] == 10
    for key in ("per_tower_batch_size", "tower_examples", "imbalance"):
        assert key not in record
    assert "towers/examples" in read_scalars(tmp_path / "towers")
    assert not list((tmp_path / "towers").glob("tower_*"))
