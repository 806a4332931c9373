"""Which Keras kerastower runs on, and the backends it refuses.

The rule is read from package metadata for ``kerastower --version`` and
applied to the imported modules by `kerastower._keras_compat.family`; a Keras 3
set to a backend other than TensorFlow or JAX fails `import kerastower` with
an `ImportError` that says how to switch. The imports run in subprocesses:
Keras reads its backend once per process.
"""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from processes import checkout_env

from kerastower import _installed_keras as installed
from kerastower._keras_compat import family

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED = (
    r"Keras 3 with the TensorFlow or JAX backend, or on Keras 2 "
    r"\(tf.keras or tf_keras\)"
)


def _import_kerastower(tmp_path, **variables):
    env = checkout_env(TF_CPP_MIN_LOG_LEVEL="3", **variables)
    env.setdefault("KERAS_HOME", str(tmp_path))  # not the user's keras.json
    return subprocess.run(
        [sys.executable, "-c", "import kerastower"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )


def _installed(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


# `numpy` needs nothing beyond Keras and NumPy to be a backend, so that the
# refusal is kerastower's own even where torch is not installed.
@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_another_keras_backend_is_refused_with_what_to_do(tmp_path, backend):
    result = _import_kerastower(tmp_path, KERAS_BACKEND=backend)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kerastower runs on "), result.stderr
    assert f"not on Keras's {backend!r} backend" in last
    assert "unset `KERAS_BACKEND` or set it to 'tensorflow' or 'jax'" in last
    assert last.endswith(f"Received: KERAS_BACKEND={backend!r}"), last
    # Whether or not the backend's package is installed, the message is ours.
    assert f"No module named '{backend}'" not in result.stderr


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_backend_of_keras_json_is_checked_too(tmp_path, backend):
    (tmp_path / "keras.json").write_text(json.dumps({"backend": backend}))
    result = _import_kerastower(tmp_path, KERAS_HOME=str(tmp_path))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    config = tmp_path / "keras.json"
    assert last.startswith("ImportError: kerastower runs on "), result.stderr
    assert f'set "backend": "tensorflow" in {config}' in last
    assert last.endswith(f"Received: backend={backend!r} in {config}"), last
    # Whether or not the backend's package is installed, the message is ours.
    assert f"No module named '{backend}'" not in result.stderr
    if backend == "torch":
        return
    # $KERAS_BACKEND wins over keras.json, as in Keras; an empty one is unset.
    chosen = _import_kerastower(
        tmp_path, KERAS_HOME=str(tmp_path), KERAS_BACKEND="tensorflow"
    )
    assert chosen.returncode == 0, chosen.stderr
    empty = _import_kerastower(tmp_path, KERAS_HOME=str(tmp_path), KERAS_BACKEND="")
    assert "Received: backend='numpy' in" in empty.stderr


def test_tensorflow_and_an_empty_variable_are_accepted(monkeypatch):
    for value in ("tensorflow", ""):
        monkeypatch.setenv("KERAS_BACKEND", value)
        installed.check_backend_variable()


def test_the_jax_backend_is_chosen_only_on_keras_3(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    _fake_versions(monkeypatch, tensorflow="2.16.2", keras="3.15.1")
    assert installed.backend() == "jax"
    installed.check_backend_variable()
    _fake_versions(monkeypatch, tensorflow="2.15.1", keras="2.15.0")
    assert installed.backend() == "tensorflow"  # Keras 2 has no other
    _fake_versions(monkeypatch, tensorflow="2.16.2", keras="3.8.0", tf_keras="2.16.0")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert installed.backend() == "tensorflow"
    monkeypatch.delenv("TF_USE_LEGACY_KERAS")
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert installed.backend() == "tensorflow"


def test_the_jax_backend_imports_or_says_what_to_install(tmp_path):
    result = _import_kerastower(tmp_path, KERAS_BACKEND="jax")
    if _installed("jax"):  # then tests/on_jax runs on it (`nox -s jax`)
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: Keras is set to its JAX backend"), last
    assert "pip install 'kerastower[jax]'" in last


def _fake_versions(monkeypatch, **versions):
    names = {"tensorflow": "tensorflow", "keras": "keras", "tf_keras": "tf_keras"}
    versions = {names[k]: v for k, v in versions.items()}
    monkeypatch.setattr(
        installed,
        "installed_version",
        lambda *dists: next((versions[d] for d in dists if d in versions), None),
    )


def test_keras_2_ignores_the_backend_variable(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    _fake_versions(monkeypatch, tensorflow="2.15.1", keras="2.15.0")
    installed.check_backend_variable()  # Keras 2 has only TensorFlow
    _fake_versions(monkeypatch, tensorflow="2.16.2", keras="3.8.0", tf_keras="2.16.0")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    installed.check_backend_variable()  # tf_keras
    monkeypatch.delenv("TF_USE_LEGACY_KERAS")
    with pytest.raises(ImportError, match=SUPPORTED):
        installed.check_backend_variable()


def test_a_backend_that_keras_loaded_is_refused_after_the_import(monkeypatch, tmp_path):
    # Where the backend's package is installed, Keras imports on it: the check
    # reads the backend Keras runs on.
    fake = types.SimpleNamespace(backend=lambda: "torch", keras_home=lambda: "/k")
    monkeypatch.setitem(sys.modules, "keras.src.backend.config", fake)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    error = family._unsupported_backend()
    assert isinstance(error, ImportError)
    assert str(error).endswith("Received: backend='torch' in /k/keras.json")
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert str(family._unsupported_backend()).endswith(
        "Received: KERAS_BACKEND='torch'"
    )
    fake.backend = lambda: "tensorflow"
    assert family._unsupported_backend() is None


@pytest.mark.parametrize(
    "versions, legacy, expected",
    [
        # The nox `package` session's TensorFlow 2.15.1, without Keras 3.
        ({"tensorflow": "2.15.1", "keras": "2.15.0"}, None, "Keras 2.15.0 (tf.keras)"),
        ({"tensorflow": "2.12.0", "keras": "2.12.0"}, "1", "Keras 2.12.0 (tf.keras)"),
        (
            {"tensorflow": "2.15.1", "keras": "2.15.0", "tf_keras": "2.15.1"},
            "1",
            "Keras 2.15.1 (tf_keras)",
        ),
        (
            {"tensorflow": "2.21.0", "keras": "3.15.1", "tf_keras": "2.21.0"},
            "true",
            "Keras 2.21.0 (tf_keras)",
        ),
        ({"tensorflow": "2.21.0", "keras": "3.15.1"}, None, "Keras 3.15.1"),
        ({"tensorflow": "2.21.0", "keras": "3.15.1"}, "0", "Keras 3.15.1"),
    ],
)
def test_the_keras_in_use_from_metadata(monkeypatch, versions, legacy, expected):
    _fake_versions(monkeypatch, **versions)
    if legacy is None:
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    else:
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", legacy)
    assert installed.installed_versions() == (versions["tensorflow"], expected)


def test_metadata_that_does_not_say_gives_none(monkeypatch):
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    _fake_versions(monkeypatch, tensorflow="2.21.0", keras="3.15.1")
    assert installed.installed_versions() is None  # tf_keras asked for, missing
    _fake_versions(monkeypatch, keras="3.15.1")
    assert installed.installed_versions() is None  # TensorFlow built from source


def test_metadata_agrees_with_the_imported_keras():
    import tensorflow as tf

    assert installed.installed_versions() == (tf.__version__, family.describe())
