"""Two real worker processes over TF_CONFIG, each with two towers."""

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from keras_family import keras, keras3_only
from oracle import assert_close

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_worker.py"
sys.path.insert(0, str(EXAMPLE.parent))
import multi_worker as example  # noqa: E402


def launch(out, *extra, timeout=240):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result, time.monotonic() - start


def load(path):
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


# The example imports Keras 3 (`import keras`); `test_multi_worker_scripts`
# trains a script that imports `tf.keras` on both families.
@keras3_only
@pytest.mark.slow
def test_two_workers_train_like_one_device_on_the_union_of_their_batches(tmp_path):
    result, _ = launch(tmp_path, "--epochs", "2")
    assert result.returncode == 0, result.stdout + result.stderr

    w0, w1 = load(tmp_path / "worker0.npz"), load(tmp_path / "worker1.npz")
    for a, b in zip(w0, w1, strict=True):
        np.testing.assert_array_equal(a, b)

    # Oracle: one device, the chief's initial weights, global batch = union of
    # the workers' batch s (4 + 4, 4 + 4, then 3 + 1 examples).
    x0, y0 = example.worker_data(0)
    x1, y1 = example.worker_data(1)
    plain = example.build_model(seed=0)
    plain.set_weights(load(tmp_path / "initial.npz"))
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    losses = []
    for _ in range(2):
        total = 0.0
        for start in (0, 4, 8):
            xb = np.concatenate([x0[start : start + 4], x1[start : start + 4]])
            yb = np.concatenate([y0[start : start + 4], y1[start : start + 4]])
            total += float(np.sum((plain.predict(xb, verbose=0) - yb) ** 2))
            plain.train_on_batch(xb, yb)
        losses.append(total / 20)
    for a, b in zip(plain.get_weights(), w0, strict=True):
        assert_close(a, b)

    assert_close(np.load(tmp_path / "predictions.npy"), plain.predict(x0, verbose=0))

    # Every worker reports the global loss, the mean over all 20 examples.
    for index in (0, 1):
        history = json.loads((tmp_path / f"history{index}.json").read_text())
        assert_close(history["loss"], losses)

    # Only the chief's checkpoints exist, and nothing temporary is left.
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert [f for f in files if f.startswith("ckpt")] == [
        "ckpt",
        "ckpt/epoch1.keras",
        "ckpt/epoch2.keras",
    ]
    assert not [f for f in files if "tmp" in f.lower()]


# The example imports Keras 3 (`import keras`); `test_multi_worker_scripts`
# trains a script that imports `tf.keras` on both families.
@keras3_only
@pytest.mark.slow
def test_accumulation_across_workers_matches_one_device(tmp_path):
    result, _ = launch(tmp_path, "--epochs", "2", "--accumulate", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    x0, y0 = example.worker_data(0)
    x1, y1 = example.worker_data(1)
    plain = example.build_model(seed=0)
    plain.set_weights(load(tmp_path / "initial.npz"))
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    # One window of three global steps (4+4, 4+4, 3+1 examples) per epoch: the
    # workers' micro-batches differ in size, so each must weigh by the global
    # count. One device: one batch of all 20 examples per epoch.
    for _ in range(2):
        plain.train_on_batch(np.concatenate([x0, x1]), np.concatenate([y0, y1]))
    w0, w1 = load(tmp_path / "worker0.npz"), load(tmp_path / "worker1.npz")
    for a, b in zip(w0, w1, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(plain.get_weights(), load(tmp_path / "worker1.npz"), strict=True):
        assert_close(a, b)


@keras3_only  # the example imports Keras 3
@pytest.mark.slow
def test_a_dying_worker_stops_the_other_with_an_error_in_bounded_time(tmp_path):
    # No collective timeout: TensorFlow's heartbeats find the dead worker.
    result, elapsed = launch(tmp_path, "--epochs", "3", "--exit-after-epoch", "1")
    assert result.returncode != 0
    assert not (tmp_path / "worker0.npz").exists()
    output = result.stdout + result.stderr
    assert any(
        word in output
        for word in (
            "DeadlineExceeded",
            "Unavailable",
            "timed out",
            "Collective ops is aborted",
            "failed",
        )
    ), output[-3000:]
    assert elapsed < 120


def test_a_later_timeout_that_would_be_ignored_warns(monkeypatch):
    from kerastower.workers import multi_worker

    made = object()  # the strategy a first call (or a TowerModel) made
    monkeypatch.setattr(multi_worker, "_STRATEGY", made)
    monkeypatch.setattr(multi_worker, "_TIMEOUT_SECONDS", 600.0)
    with pytest.warns(UserWarning, match=r"`timeout_seconds=15` is ignored: .*=600"):
        assert multi_worker.worker_strategy(timeout_seconds=15) is made
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert multi_worker.worker_strategy(timeout_seconds=600) is made
        assert multi_worker.worker_strategy() is made
