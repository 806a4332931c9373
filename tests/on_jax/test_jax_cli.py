"""``kerastower`` on JAX: ``--version``, ``devices`` and the demo's errors.

The demo itself runs in ``nox -s jax`` (from the installed wheel)."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[2]


def kerastower(*args):
    env = dict(os.environ, KERAS_BACKEND="jax")
    env.pop("XLA_FLAGS", None)  # the command sets its own devices
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    return subprocess.run(
        [sys.executable, "-m", "kerastower", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )


def test_version_names_jax_and_keras():
    done = kerastower("--version")
    assert done.returncode == 0, done.stderr
    assert f"(JAX {jax.__version__}, Keras 3." in done.stdout


@pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="this machine has no CPU-only JAX"
)
def test_devices_makes_the_cpu_devices_asked_for():
    done = kerastower("devices", "--towers", "3", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert "TowerModel(towers=3) would use:" in done.stdout
    assert "tower 2  cpu:2" in done.stdout


def test_demo_refuses_tower_monitor_logs():
    done = kerastower("demo", "--log-dir", "/tmp/logs")
    assert done.returncode == 2
    assert "`--log-dir` writes TowerMonitor's logs" in done.stderr


@pytest.mark.skipif(
    jax.default_backend() == "gpu", reason="a machine with a GPU has no such error"
)
def test_demo_on_a_gpu_without_one_says_so():
    done = kerastower("demo", "--device", "gpu")
    assert done.returncode == 1
    assert "`--device gpu` needs a GPU" in done.stderr
