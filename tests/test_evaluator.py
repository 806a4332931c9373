"""`SidecarEvaluator`: each checkpoint evaluated as `model.evaluate` would.

The oracle is a plain `keras.Model` that loads the same checkpoint and
evaluates the same data on one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import keras
import numpy as np
import pytest
from oracle import assert_close, mlp, regression_data

import kerastower
from kerastower.callbacks import ChiefCheckpoint
from kerastower.workers.evaluator import LOG_NAME, SidecarEvaluator

# The one-device oracle loads `.keras` files without building their optimizer.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Skipping variable loading for optimizer:UserWarning"
)

X, Y = regression_data(n=40)
X_VAL, Y_VAL = regression_data(n=23, seed=5)


def compiled(model):
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def towered():
    return compiled(kerastower.TowerModel.from_model(mlp(), towers=3))


def one_device_evaluation(path):
    plain = compiled(mlp())
    plain.load_weights(path)
    return plain.evaluate(X_VAL, Y_VAL, batch_size=10, verbose=0, return_dict=True)


def train(tmp_path, epochs=3):
    filepath = str(tmp_path / "ckpt" / "{epoch:02d}.keras")
    model = towered()
    model.fit(
        X,
        Y,
        batch_size=8,
        epochs=epochs,
        verbose=0,
        callbacks=[ChiefCheckpoint(filepath)],
    )
    return filepath


def test_every_checkpoint_is_evaluated_as_one_device_evaluates_it(tmp_path):
    filepath = train(tmp_path)
    log_dir = tmp_path / "logs"
    evaluator = SidecarEvaluator(
        towered(),
        X_VAL,
        Y_VAL,
        filepath=filepath,
        batch_size=10,  # 23 examples: batches of 10, 10 and 3 over 3 towers
        log_dir=str(log_dir),
        best_filepath=str(tmp_path / "best.keras"),
        poll_interval=0.05,
    )
    evaluator.stop()  # training has ended: evaluate what is there, then return
    results = evaluator.start()
    assert [r["epoch"] for r in results] == [1, 2, 3]
    for result in results:
        expected = one_device_evaluation(result["checkpoint"])
        assert sorted(result["metrics"]) == sorted(expected)
        for name, value in expected.items():
            assert_close(result["metrics"][name], value)
    logged = [
        json.loads(line) for line in (log_dir / LOG_NAME).read_text().splitlines()
    ]
    assert logged == results
    assert list((log_dir / "validation").glob("events.out.tfevents.*"))
    best = min(results, key=lambda r: r["metrics"]["loss"])
    assert_close(
        one_device_evaluation(str(tmp_path / "best.keras"))["loss"],
        best["metrics"]["loss"],
        rtol=1e-6,
        atol=1e-7,
    )
    # A new evaluator on the same log skips what was evaluated.
    again = SidecarEvaluator(
        towered(), X_VAL, Y_VAL, filepath=filepath, log_dir=str(log_dir)
    )
    again.stop()
    assert again.start() == []
    assert again._best == best["metrics"]["loss"]  # to beat, after a restart


def test_checkpoints_are_evaluated_as_they_arrive_until_training_ends(tmp_path):
    filepath = str(tmp_path / "ckpt" / "{epoch:02d}.keras")
    evaluator = SidecarEvaluator(
        towered(), X_VAL, Y_VAL, filepath=filepath, poll_interval=0.05
    )
    results = []
    watcher = threading.Thread(target=lambda: results.extend(evaluator.start()))
    watcher.start()
    train(tmp_path, epochs=2)
    evaluator.stop()
    watcher.join(timeout=60)
    assert not watcher.is_alive()
    assert [r["epoch"] for r in results] == [1, 2]


def test_it_stops_when_no_checkpoint_comes_for_idle_timeout(tmp_path):
    filepath = train(tmp_path, epochs=1)
    evaluator = SidecarEvaluator(
        towered(), X_VAL, Y_VAL, filepath=filepath, poll_interval=0.05, idle_timeout=0.2
    )
    assert [r["epoch"] for r in evaluator.start()] == [1]


def test_epochs_and_max_evaluations_stop_it_early(tmp_path):
    filepath = train(tmp_path)
    for kwargs, expected in ((dict(epochs=2), [1, 2]), (dict(max_evaluations=1), [1])):
        evaluator = SidecarEvaluator(
            towered(), X_VAL, Y_VAL, filepath=filepath, poll_interval=0.05, **kwargs
        )
        assert [r["epoch"] for r in evaluator.start()] == expected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(filepath="{epoch}/model.keras"), "not in the directory"),
        (dict(mode="up"), '`mode` must be "auto", "min" or "max". Received: mode'),
        (dict(epochs=0), "`epochs` must be an integer >= 1 or None"),
        (dict(max_evaluations=1.5), "`max_evaluations` must be an integer"),
        (dict(poll_interval=0), "`poll_interval` must be > 0. Received"),
        (dict(idle_timeout=-1), "`idle_timeout` must be > 0 or None. Received"),
    ],
)
def test_bad_arguments(kwargs, message):
    kwargs = dict(filepath="ckpt/{epoch}.keras") | kwargs
    with pytest.raises(ValueError, match=message):
        SidecarEvaluator(compiled(mlp()), X_VAL, Y_VAL, **kwargs)


def test_unused_plain_model_is_accepted_too(tmp_path):
    filepath = train(tmp_path, epochs=1)
    evaluator = SidecarEvaluator(
        compiled(mlp()), X_VAL, Y_VAL, filepath=filepath, batch_size=10
    )
    evaluator.stop()
    results = evaluator.start()
    expected = one_device_evaluation(results[0]["checkpoint"])
    assert_close(results[0]["metrics"]["loss"], expected["loss"], rtol=1e-6, atol=0)
    assert np.isfinite(results[0]["metrics"]["mae"])


@pytest.mark.slow
def test_an_evaluator_beside_two_workers_evaluates_each_checkpoint(tmp_path):
    # `kerastower launch -n 2 --evaluator`: the evaluator's numbers for each
    # checkpoint equal one device's `evaluate` of that checkpoint, and it
    # exits once training has ended.
    script = Path(__file__).parent / "workers" / "evaluated.py"
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=root)
    env.pop("TF_CONFIG", None)
    launch = [sys.executable, "-m", "kerastower", "launch", "-n", "2"]
    result = subprocess.run(
        [*launch, "--towers", "2", "--evaluator", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "and the evaluator on 127.0.0.1:" in result.stderr
    assert "[evaluator] EVALUATED" in result.stdout
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists()
    logged = [
        json.loads(line)
        for line in (tmp_path / "logs" / LOG_NAME).read_text().splitlines()
    ]
    assert [r["epoch"] for r in logged] == [1, 2, 3]
    sys.path.insert(0, str(script.parent))
    try:
        import evaluated
    finally:
        sys.path.pop(0)
    x, y = evaluated.validation_data()
    for result in logged:
        plain = evaluated.build_model(keras.Model)
        plain.load_weights(result["checkpoint"])
        expected = plain.evaluate(x, y, batch_size=7, verbose=0, return_dict=True)
        for name, value in expected.items():
            assert_close(result["metrics"][name], value)
