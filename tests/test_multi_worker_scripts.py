"""The natural multi-worker script under ``kerastower launch``, against one device.

`tests/workers/natural.py` builds its model before any strategy exists and
never calls `kerastower.worker_strategy()`. Two and three workers on
loopback, with equal and mixed tower counts, must train the model one device
trains on the union of the workers' batches.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras, keras3_only_until_ported, spectral_normalization
from oracle import assert_close

from kerastower import _keras_compat

SCRIPT = Path(__file__).resolve().parent / "workers" / "natural.py"
sys.path.insert(0, str(SCRIPT.parent))
import natural  # noqa: E402


def launch(out, workers, towers, family, *extra, timeout=300, replicas=False):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["KERASTOWER_REPLICATE_VARIABLES"] = "1" if replicas else "0"
    env.pop("TF_CONFIG", None)
    env.pop("KERASTOWER_LOGICAL_DEVICES", None)
    command = [sys.executable, "-m", "kerastower", "launch", "-n", str(workers)]
    command += ["--towers", towers, str(SCRIPT), str(out), family, *extra]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout
    )


on_replicas = keras3_only_until_ported("replicas")
THREADS_NOISE = 4


class GlobalBatches(getattr(keras.utils, "PyDataset", keras.utils.Sequence)):
    """Step ``s`` of one device: batch ``s`` of every worker, in worker order."""

    def __init__(self, workers, family):
        super().__init__()
        data = [natural.family_data(family, i) for i in range(workers)]
        self.batches = []
        for start in range(0, len(data[0][0]), natural.BATCH):
            end = start + natural.BATCH
            self.batches.append(
                tf.nest.map_structure(
                    lambda *parts, rows=slice(start, end): np.concatenate(
                        [part[rows] for part in parts]
                    ),
                    *data,
                )
            )

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


def one_device_model(family, initial):
    if family == "embedding":
        plain = keras.Model(*natural.embedding_graph(seed=0))
    elif family == "masked":
        plain = keras.Model(*natural.masked_graph(seed=0))
    elif family == "spectral":
        plain = keras.Model(*natural.spectral_graph(seed=0))
    elif family == "contrastive":
        plain = keras.Model(*natural.contrastive_graph(seed=0))
    elif family == "two_outputs":
        plain = keras.Model(*natural.two_outputs_graph(seed=0))
    else:
        hidden, out = natural.layers(seed=0)
        inputs = keras.Input((natural.FEATURES,))
        plain = keras.Model(inputs, out(hidden(inputs)))
    with np.load(initial) as data:  # the chief's initial weights
        plain.set_weights([data[f"arr_{k}"] for k in range(len(data.files))])
    plain.compile(**natural.compile_arguments(family))
    return plain


def one_device(workers, family, initial):
    plain = one_device_model(family, initial)
    history = plain.fit(
        GlobalBatches(workers, family),
        epochs=natural.EPOCHS,
        shuffle=False,
        verbose=0,
    )
    return plain.get_weights(), history.history


@pytest.mark.slow
@pytest.mark.parametrize(
    "workers, towers, family",
    [
        (2, "2", "dense"),
        # Batches of a static size: 4 examples split evenly on worker 0's 2
        # towers (every tower called, no conditional), unevenly on worker
        # 1's 3 (a conditional on the batch size).
        (2, "2,3", "even"),
        pytest.param(2, "2,3", "even-replicas", marks=on_replicas),
        (2, "2,3", "from_model"),
        (3, "2,3,1", "subclassed"),
        # Sparse gradients with Adam: token rows that several workers hit,
        # and a position table every tower gathers whole (static rows).
        (2, "2,3", "embedding"),
        # Masked loss and masked BatchNormalization: workers hold different
        # fractions of valid steps, and in the last step one worker runs its
        # batch on one tower while the other splits it (both still meet).
        (2, "2,3", "masked"),
        (3, "2,3,1", "masked"),
        # A weight update in the forward pass, once per step on every worker.
        pytest.param(
            2,
            "2,3",
            "spectral",
            marks=spectral_normalization,
        ),
        # A loss of the whole global batch (`global_batch_loss`): every
        # worker's rows gathered, also from a worker whose last batch (1 or
        # 2 examples) runs on one tower.
        (2, "2,3", "contrastive"),
        (3, "2,3,1", "contrastive"),
        # A loss metric per output, weighted as one device weighs it over
        # steps of different sizes.
        (2, "2,3", "two_outputs"),
        # Replicas in one ring over every worker's towers (the GPU path).
        pytest.param(2, "2,3", "dense-replicas", marks=on_replicas),
        pytest.param(3, "2,3,1", "embedding-replicas", marks=on_replicas),
        pytest.param(2, "2,3", "masked-replicas", marks=on_replicas),
        # A `train_step` of one's own: on replicas, each step copies the
        # weights its optimizer updated to every tower.
        (2, "2,3", "own_step"),
        pytest.param(2, "2,3", "own_step-replicas", marks=on_replicas),
    ],
)
def test_natural_script_trains_the_one_device_model(tmp_path, workers, towers, family):
    assert_trains_the_one_device_model(tmp_path, workers, towers, family)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family",
    [
        # Synchronised statistics in both branches of the step (the last
        # step runs one worker's batch on one tower) and sparse rows, in the
        # loop of Keras's steps: the sums over the workers keep their keys.
        "masked",
        "embedding",
        # The batch gathered for `global_batch_loss`, 8 examples then 3.
        "contrastive",
        pytest.param("dense-replicas", marks=on_replicas),
    ],
)
def test_several_steps_per_execution_train_the_one_device_model(tmp_path, family):
    # Three steps an epoch: one execution of two steps, then one of one.
    assert_trains_the_one_device_model(tmp_path, 2, "2,3", family, "1", "2")


def assert_trains_the_one_device_model(tmp_path, workers, towers, family, *extra):
    family, _, replicas = family.partition("-")
    result = launch(tmp_path, workers, towers, family, *extra, replicas=bool(replicas))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    weights, history = one_device(workers, family, tmp_path / "initial.npz")
    counts = [int(t) for t in towers.split(",")] * (workers if "," not in towers else 1)
    for index in range(workers):
        report = json.loads((tmp_path / f"history{index}.json").read_text())
        assert report["workers"] == workers
        assert report["towers"] == counts[index]
        assert report["replicas"] is bool(replicas)
        # The towers of every worker are one traced function, but for the
        # batch gathered for `global_batch_loss`.
        traced = family != "contrastive" and _keras_compat.keeps_functions_apart()
        assert report.pop("traced_once") is traced
        # No collective starts a thread that outlives it (TensorFlow's
        # per-collective timeout does: two a collective, for the timeout).
        first, last = report.pop("threads")
        assert last - first <= THREADS_NOISE, (first, last)
        assert report.keys() - {"towers", "workers", "replicas"} == history.keys()
        for key in history:  # the loss, per-output losses, compiled metrics
            assert_close(report[key], history[key], err_msg=key)
        with np.load(tmp_path / f"worker{index}.npz") as final:
            trained = [final[f"arr_{k}"] for k in range(len(final.files))]
        for a, b in zip(weights, trained, strict=True):
            assert_close(b, a)


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [False, pytest.param(True, marks=on_replicas)])
def test_accumulated_sparse_rows_across_workers_train_the_one_device_model(
    tmp_path, replicas
):
    # Both workers' micro-batches hit the same token rows. Keras's Adam
    # squares each row of a one-device gradient on its own, so the window must
    # keep every micro-batch's rows from every worker (and sum the position
    # table's by index), not a dense sum.
    result = launch(tmp_path, 2, "2,3", "embedding", "3", replicas=replicas)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plain = one_device_model("embedding", tmp_path / "initial.npz")
    # Three global steps per epoch make one window: one device's batch of
    # all 21 examples, in the order of the steps.
    batches = GlobalBatches(2, "embedding").batches
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    for _ in range(natural.EPOCHS):
        plain.train_on_batch(x, y)
    for index in range(2):
        with np.load(tmp_path / f"worker{index}.npz") as final:
            trained = [final[f"arr_{k}"] for k in range(len(final.files))]
        for a, b in zip(plain.get_weights(), trained, strict=True):
            assert_close(b, a)


@pytest.mark.slow
def test_workers_whose_steps_trace_again_at_different_times_still_meet(tmp_path):
    # Keras traces a worker's step again for a batch of a new shape; the
    # other worker's trace takes the same keys for its sums over the workers.
    import retrace

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "kerastower", "launch", "-n", "2"]
    command += ["--towers", "2", str(SCRIPT.parent / "retrace.py"), str(tmp_path)]
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    plain = keras.Model(*retrace.graph(seed=0))
    with np.load(tmp_path / "initial.npz") as data:
        plain.set_weights([data[f"arr_{k}"] for k in range(len(data.files))])
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    data = [retrace.worker_data(i) for i in range(2)]
    starts = [0, 0]
    for sizes in zip(*retrace.SIZES):
        batch = [
            [part[start : start + size] for part in worker]
            for worker, start, size in zip(data, starts, sizes)
        ]
        plain.train_on_batch(*(np.concatenate(parts) for parts in zip(*batch)))
        starts = [start + size for start, size in zip(starts, sizes)]
    for index in range(2):
        with np.load(tmp_path / f"worker{index}.npz") as final:
            trained = [final[f"arr_{k}"] for k in range(len(final.files))]
        for a, b in zip(plain.get_weights(), trained, strict=True):
            assert a.dtype == b.dtype == np.float64
            assert_close(b, a, rtol=1e-10, atol=1e-12)


def _python(code, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("KERASTOWER_")}
    full.pop("TF_CONFIG", None)
    full.update(TF_CPP_MIN_LOG_LEVEL="2", **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


TWO_WORKERS = json.dumps(
    {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0},
    }
)


def test_tensorflow_work_before_the_import_gets_an_error_saying_what_to_move():
    result = _python(
        "import tensorflow as tf\n"
        "tf.constant(1.0) + 1.0\n"
        "import kerastower\n"
        "kerastower.worker_strategy()\n",
        TF_CONFIG=TWO_WORKERS,
    )
    assert result.returncode != 0
    assert "Move `import kerastower` above the first layer" in result.stderr


def test_logical_devices_come_from_the_environment():
    result = _python(
        "import kerastower\nprint(len(kerastower.available_devices()))\n",
        KERASTOWER_LOGICAL_DEVICES="3",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["3"]
    bad = _python("import kerastower\n", KERASTOWER_LOGICAL_DEVICES="two")
    assert bad.returncode != 0
    assert (
        "`KERASTOWER_LOGICAL_DEVICES` must be an integer >= 1. "
        "Received: KERASTOWER_LOGICAL_DEVICES='two'"
    ) in bad.stderr
