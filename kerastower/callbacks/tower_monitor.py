"""`TowerMonitor`: throughput, step time and per-tower work, logged per epoch."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.callbacks.counting import loss_count
from kerastower.step.shards import split_sizes
from kerastower.workers import cluster


def execution_batch_sizes(
    examples: int, steps: int, full_batch_size: int | None = None
) -> list[int]:
    """Returns the global batch size of each step of one execution.

    Keras calls the batch callbacks once per execution of up to
    ``steps_per_execution`` steps, so a callback only sees how many examples
    the execution held in all. `fit` gives every step the full global batch
    ``F`` except the last step of an epoch, and an execution that reaches the
    end of the data runs fewer steps than asked; so the execution held
    ``n = ceil(examples / F)`` steps, ``n - 1`` of ``F`` examples and a last
    one with the rest. When ``F`` is not known yet (the first execution) or
    the execution holds more than ``steps * F`` examples, ``F`` is taken as
    ``ceil(examples / steps)``.

    Example:

    ```python
    >>> execution_batch_sizes(30, 1)
    [30]
    >>> execution_batch_sizes(87, 3, full_batch_size=30)  # the epoch's last
    [30, 30, 27]
    >>> execution_batch_sizes(3, 2, full_batch_size=5)    # data ran out
    [3]
    ```

    Args:
        examples: Examples in the execution (all its steps, all towers), an
            integer >= 0.
        steps: The most steps the execution can hold (``steps_per_execution``),
            an integer >= 1.
        full_batch_size: The full global batch size ``F``, when an earlier
            execution showed it; ``None`` to infer it. Defaults to ``None``.

    Returns:
        The global batch size of each step that ran, summing to ``examples``
        (empty when ``examples`` is 0).

    Raises:
        ValueError: If `steps` is not an integer >= 1 or `examples` is
            negative.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be an integer >= 1. Received: steps={steps!r}")
    if not isinstance(examples, int) or examples < 0:
        raise ValueError(
            f"`examples` must be an integer >= 0. Received: examples={examples!r}"
        )
    if examples == 0:
        return []
    full = full_batch_size
    if not full or examples > steps * full:
        full = math.ceil(examples / steps)
    ran = math.ceil(examples / full)
    return [full] * (ran - 1) + [examples - (ran - 1) * full]


def tower_examples(batch_sizes: list[int], towers: int) -> list[int]:
    """Returns how many examples each tower processed over some global batches.

    Tower ``i`` gets ``split_sizes(B, N)[i]`` examples of each global batch of
    ``B`` examples (see `kerastower.split_sizes`), so its total is the sum of
    those over the batches.

    Example:

    ```python
    >>> tower_examples([10, 10, 7], 3)   # two batches of 10 and one of 7
    [11, 9, 7]
    ```

    Args:
        batch_sizes: The global batch size of each step.
        towers: The number of towers ``N``, an integer >= 1.

    Returns:
        A list of ``N`` totals summing to ``sum(batch_sizes)``.
    """
    totals = [0] * towers
    for batch_size in batch_sizes:
        for i, size in enumerate(split_sizes(batch_size, towers)):
            totals[i] += size
    return totals


class TowerMonitor(keras.callbacks.Callback):
    """Logs throughput, step time and each tower's share of the work per epoch.

    At the end of every epoch the callback computes:

    - ``examples``: the training examples of the epoch, all towers together,
      counted exactly (from the model's ``loss`` metric, which counts the
      examples of every global batch);
    - ``steps``: the training steps (global batches) of the epoch;
    - ``examples_per_second``: ``examples / t`` and ``step_time``: ``t / steps``
      (seconds), where ``t`` is the wall time from the start of the epoch to
      the end of its last training step (validation excluded). The first
      epoch includes tracing the step function;
    - ``global_batch_size``: the largest global batch ``B`` of the epoch;
    - ``per_tower_batch_size``: how `TowerModel` splits ``B`` over the ``N``
      towers, ``split_sizes(B, N)``: for ``B = 10`` and ``N = 3``,
      ``[4, 3, 3]``;
    - ``tower_examples``: the examples each tower processed in the epoch, the
      sum of its shares of every global batch (the last, short batch
      included);
    - ``imbalance``: ``max(tower_examples) / mean(tower_examples) - 1``, 0 when
      every tower did the same work;
    - ``learning_rate``: the optimizer's learning rate at the end of the epoch;
    - ``peak_memory_mb`` per tower, on GPUs only (TensorFlow tracks no device
      memory on CPUs): each tower device's peak memory during the epoch.

    The scalars ``examples_per_second`` and ``step_time`` are added to the
    epoch logs (so `History`, `CSVLogger` and the progress bar show them when
    they come after this callback); every value is kept in `history`, one
    dict per epoch. With `log_dir`, the values are written with `tf.summary`
    for TensorBoard, step = epoch: the run ``<log_dir>/towers`` holds
    ``towers/examples_per_second``, ``towers/step_time_ms``,
    ``towers/examples``, ``towers/steps``, ``towers/global_batch_size``,
    ``towers/imbalance`` and ``towers/learning_rate``; one run per tower,
    ``<log_dir>/towers/tower_<i>``, holds ``tower/examples``,
    ``tower/batch_size``, ``tower/examples_per_second`` and (GPUs)
    ``tower/peak_memory_mb``, so TensorBoard draws one line per tower in each
    of those charts. On a worker other than the chief of a multi-worker
    cluster (see `kerastower.cluster`) the runs go under
    ``<log_dir>/worker_<index>`` instead.

    With several workers (a model whose ``num_workers`` is > 1) the model's
    metrics count the examples of every worker, so ``examples``,
    ``examples_per_second`` and ``global_batch_size`` are those of the whole
    cluster; this worker's share of each step is not known, so
    ``per_tower_batch_size``, ``tower_examples`` and ``imbalance`` are left
    out (``peak_memory_mb`` stays: it is measured on this worker's towers).

    A plain `keras.Model` counts as one tower. With ``steps_per_execution >
    1`` the callback sees whole executions; it takes every step but the last
    of an epoch to hold the full global batch, as `fit` batches arrays and
    datasets (see `execution_batch_sizes`).

    Example:

    ```python
    import keras
    import numpy as np

    import kerastower

    kerastower.configure_logical_devices(4)  # without GPUs: 4 logical CPUs

    inputs = keras.Input((8,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs), towers=4)
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(600, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    monitor = kerastower.callbacks.TowerMonitor("logs")
    model.fit(x, y, batch_size=30, epochs=3, callbacks=[monitor])
    print(monitor.history[-1]["per_tower_batch_size"])  # [8, 8, 7, 7]
    # Then: tensorboard --logdir logs
    ```

    Args:
        log_dir: Directory for the TensorBoard event files, or ``None`` to
            keep the values in the logs and `history` only. Defaults to
            ``None``.

    Raises:
        ValueError: If `log_dir` is not ``None`` or a path; at the first
            training step, if the model has no ``loss`` metric that counts
            examples (a custom `train_step` that does not update it).
    """

    def __init__(self, log_dir: str | os.PathLike | None = None):
        super().__init__()
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(
                f"`log_dir` must be None or a path. Received: log_dir={log_dir!r}"
            )
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.history: list[dict[str, Any]] = []
        self._writers: dict[str, Any] = {}
        self._towers = 1
        self._workers = 1
        self._devices: list[str] = []
        self._full_batch: int | None = None

    @property
    def run_dir(self) -> str | None:
        """The directory this worker's runs are written under, or ``None``."""
        if self.log_dir is None:
            return None
        if cluster.is_chief():
            return self.log_dir
        return os.path.join(self.log_dir, f"worker_{cluster.worker_index()}")

    def on_train_begin(self, logs=None):
        _keras_compat.check_execution_steps(self.model, "TowerMonitor")
        self._towers = int(getattr(self.model, "num_towers", 1))
        self._workers = int(getattr(self.model, "num_workers", 1))
        self._devices = list(getattr(self.model, "tower_devices", []))
        self._full_batch = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._end = self._start
        self._batch_sizes: list[int] = []
        self._counted = 0
        self._last_batch = -1
        self._memory = self._memory_devices()
        for device in self._memory:
            tf.config.experimental.reset_memory_stats(device)

    def on_train_batch_end(self, batch, logs=None):
        count = loss_count(self.model)
        if count is None:
            raise ValueError(
                "`TowerMonitor` counts examples with the model's `loss` "
                "metric, which this model does not have (does a custom "
                "`train_step` skip it?). Received: metrics="
                f"{[m.name for m in self.model.metrics]}"
            )
        self._end = time.perf_counter()
        examples = count - self._counted
        steps = batch - self._last_batch
        self._counted, self._last_batch = count, batch
        sizes = execution_batch_sizes(examples, steps, self._full_batch)
        self._full_batch = max(self._full_batch or 0, *sizes)
        self._batch_sizes.extend(sizes)

    def on_epoch_end(self, epoch, logs=None):
        if not self._batch_sizes:
            return
        seconds = max(self._end - self._start, 1e-9)
        examples = sum(self._batch_sizes)
        steps = len(self._batch_sizes)
        largest = max(self._batch_sizes)
        record = {
            "epoch": epoch,
            "examples": examples,
            "steps": steps,
            "seconds": seconds,
            "examples_per_second": examples / seconds,
            "step_time": seconds / steps,
            "global_batch_size": largest,
            "learning_rate": self._learning_rate(),
        }
        if self._workers == 1:
            # With several workers the loss metric counts every worker's
            # examples, and this worker's share of each step is unknown.
            per_tower = tower_examples(self._batch_sizes, self._towers)
            mean = examples / self._towers
            record["per_tower_batch_size"] = split_sizes(largest, self._towers)
            record["tower_examples"] = per_tower
            record["imbalance"] = max(per_tower) / mean - 1 if mean else 0.0
        if self._memory:
            record["peak_memory_mb"] = [
                tf.config.experimental.get_memory_info(d)["peak"] / 2**20
                for d in self._memory
            ]
        self.history.append(record)
        if logs is not None:
            logs["examples_per_second"] = record["examples_per_second"]
            logs["step_time"] = record["step_time"]
        if self.log_dir is not None:
            self._write(record)

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}

    def _learning_rate(self) -> float | None:
        optimizer = getattr(self.model, "optimizer", None)
        try:
            return float(tf.convert_to_tensor(optimizer.learning_rate).numpy())
        except (AttributeError, TypeError, ValueError):
            return None

    def _memory_devices(self) -> list[str]:
        devices = self._devices if len(self._devices) == self._towers else []
        if not devices or any("GPU" not in d.upper() for d in devices):
            return []
        return devices

    def _writer(self, name: str):
        if name not in self._writers:
            path = os.path.join(self.run_dir, *name.split("/"))
            self._writers[name] = tf.summary.create_file_writer(path)
        return self._writers[name]

    def _write(self, record: dict[str, Any]) -> None:
        epoch = record["epoch"]
        scalars = {
            "examples_per_second": record["examples_per_second"],
            "step_time_ms": record["step_time"] * 1000.0,
            "examples": record["examples"],
            "steps": record["steps"],
            "global_batch_size": record["global_batch_size"],
        }
        for name in ("imbalance", "learning_rate"):
            if record.get(name) is not None:
                scalars[name] = record[name]
        with self._writer("towers").as_default(step=epoch):
            for name, value in scalars.items():
                tf.summary.scalar(f"towers/{name}", value)
        for i in range(self._towers):
            tower = {}
            if "tower_examples" in record:
                tower["examples"] = record["tower_examples"][i]
                tower["batch_size"] = record["per_tower_batch_size"][i]
                tower["examples_per_second"] = (
                    record["tower_examples"][i] / record["seconds"]
                )
            if "peak_memory_mb" in record:
                tower["peak_memory_mb"] = record["peak_memory_mb"][i]
            if tower:
                with self._writer(f"towers/tower_{i}").as_default(step=epoch):
                    for name, value in tower.items():
                        tf.summary.scalar(f"tower/{name}", np.float32(value))
        self._flush()

    def _flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()
