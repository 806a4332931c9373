"""Test setup: four logical CPUs, configured before TensorFlow starts."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import kerastower  # noqa: E402

NUM_DEVICES = 4
kerastower.configure_logical_devices(NUM_DEVICES)
assert len(tf.config.list_logical_devices("CPU")) == NUM_DEVICES


@pytest.fixture
def float64():
    """Builds the test's models in float64 (floatx and the dtype policy)."""
    from oracle import float64 as in_float64

    with in_float64():
        yield


# The core of the promise, towers against one device, in a few minutes:
# `python -m pytest -m core` (README), and what `nox -s oldest` runs. One
# multi-worker case: TensorFlow's collective start-up changed between
# releases (2.16's failed to start, unseen, while CI ran workers on 2.21).
CORE = (
    "tests/test_equivalence.py",
    "tests/test_keras_compat.py",
    "tests/properties/",
    "tests/test_multi_worker_scripts.py::"
    "test_natural_script_trains_the_one_device_model[2-2,3-masked]",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(CORE):
            item.add_marker(pytest.mark.core)
