"""``jit_compile=True`` on towers: XLA compiles each tower on its own device.

TensorFlow's executor log (``TF_CPP_VMODULE=executor=1``) names the device of
every op it runs; an XLA cluster runs as ``_XlaRun``. A subprocess trains a
convnet with BatchNormalization on three logical CPUs and the test counts
where the clusters ran. Exactness under XLA is in
tests/properties/test_model_families.py (``test_xla_per_tower_matches_one_device``).
"""

import collections
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_RUN = re.compile(r"\}\} = (_XlaRun|_MklNativeFusedConv2D|Conv2D)\b.* device: (\S+)")

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import kerastower
    kerastower.configure_logical_devices(3)
    import keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    hidden = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    model = kerastower.TowerModel(
        inputs,
        keras.layers.Dense(5)(hidden),
        towers=3,
        replicate_variables=sys.argv[1] == "replicas",
    )
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=sys.argv[2] == "jit",
    )
    x = np.random.default_rng(0).normal(size=(12, 8, 8, 3)).astype("float32")
    model.fit(x, np.zeros((12,), "int32"), batch_size=6, verbose=0)
    model.predict(x, batch_size=6, verbose=0)
    """
)


def clusters_per_device(replicas: str, jit: str) -> collections.Counter:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        TF_CPP_MIN_LOG_LEVEL="0",
        TF_CPP_VMODULE="executor=1",
    )
    env.pop("TF_CPP_MAX_VLOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, replicas, jit],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ran = collections.Counter()
    for line in done.stderr.splitlines():
        if match := _RUN.search(line):
            ran[match.group(1), match.group(2).rsplit("/", 1)[-1]] += 1
    return ran


@pytest.mark.parametrize("replicas", ["shared", "replicas"])
def test_each_tower_runs_its_own_xla_clusters(replicas):
    ran = clusters_per_device(replicas, "jit")
    towers = ["device:CPU:0", "device:CPU:1", "device:CPU:2"]
    for device in towers:
        assert ran["_XlaRun", device] > 0, ran
    # Without XLA per tower, every cluster ran on the first device.
    assert ran["_XlaRun", towers[1]] >= ran["_XlaRun", towers[0]] // 2, ran


def test_without_jit_compile_nothing_is_compiled():
    ran = clusters_per_device("shared", "nojit")
    assert not [key for key in ran if key[0] == "_XlaRun"], ran
