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
    import keras

    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_floatx(floatx)
    keras.config.set_dtype_policy(policy)
