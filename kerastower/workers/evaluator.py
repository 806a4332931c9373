"""`SidecarEvaluator`: evaluates each checkpoint as training writes it.

Public as `kerastower.evaluator`, whose docstring says what the evaluator
task does and why it never blocks the training workers.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

from kerastower._keras_compat.family import keras
from kerastower.callbacks.checkpoint_files import (
    checkpoint_epoch,
    list_checkpoints,
    name_regex,
    write_atomically,
)
from kerastower.workers.configs import TRAINING_DONE_VARIABLE

LOG_NAME = "evaluations.jsonl"
"""The JSON lines log that `SidecarEvaluator` keeps in its `log_dir`."""


@contextmanager
def _stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    """Sets `stop` on SIGTERM (in the main thread), as the launcher ends a job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class SidecarEvaluator:
    """Evaluates every checkpoint that training writes, beside the workers.

    The evaluator polls the directory of `filepath` (the pattern given to
    `kerastower.callbacks.ChiefCheckpoint`, such as
    ``"ckpt/{epoch:03d}.keras"``) and evaluates each checkpoint it has not
    evaluated yet, oldest first: it loads the checkpoint's weights into
    `model` (`model.load_weights`) and calls ``model.evaluate(x, y, ...)``, so
    its numbers are those of `model.evaluate` on the checkpoint's weights.
    Each result goes to

    - a JSON lines file ``<log_dir>/evaluations.jsonl``, one object per
      checkpoint: ``{"checkpoint", "modified_ns", "epoch", "metrics",
      "seconds"}``. A new evaluator on the same `log_dir` skips the
      checkpoints listed there;
    - TensorBoard, as Keras's `TensorBoard` callback writes validation
      metrics: scalars ``epoch_<metric>`` in ``<log_dir>/validation``, at
      step ``epoch - 1`` (the checkpoint named epoch 1 holds the weights after
      the first epoch, which `TensorBoard` logs as step 0);
    - with `best_filepath`, a copy of the best checkpoint so far by
      `monitor`, written atomically.

    It stops when training has ended, after evaluating the checkpoints
    written so far: under ``kerastower launch --evaluator``, once every
    worker has finished (the launcher then creates the file that
    ``$KERASTOWER_TRAINING_DONE_FILE`` names); on SIGTERM or `stop`; once the
    checkpoint of epoch `epochs` is evaluated; after `max_evaluations`; or
    when no new checkpoint came for `idle_timeout` seconds.

    Example, in the script that every task of the cluster runs:

    ```python
    import keras
    import numpy as np

    import kerastower

    inputs = keras.Input((8,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(640, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    filepath = "ckpt/{epoch:03d}.keras"

    if kerastower.cluster.is_evaluator():
        kerastower.evaluator.SidecarEvaluator(
            model, x[:128], y[:128], filepath=filepath, log_dir="logs"
        ).start()
    else:
        checkpoint = kerastower.callbacks.ChiefCheckpoint(filepath)
        model.fit(x, y, batch_size=64, epochs=3, callbacks=[checkpoint])
    ```

    Args:
        model: A compiled model with the architecture of the checkpoints: a
            `kerastower.TowerModel` evaluates on this process's towers.
        x: The evaluation inputs, as for `model.evaluate`.
        y: The targets, as for `model.evaluate`. Defaults to ``None``.
        filepath: The checkpoint callback's `filepath` pattern; its ``{...}``
            fields must be in the file name, not in the directory.
        batch_size: As for `model.evaluate`. Defaults to ``None``.
        steps: As for `model.evaluate`. Defaults to ``None``.
        sample_weight: As for `model.evaluate`. Defaults to ``None``.
        log_dir: Where the JSON lines log and the TensorBoard events go, or
            ``None`` for neither. Defaults to ``None``.
        best_filepath: Where to copy the best checkpoint, or ``None``.
            Defaults to ``None``.
        monitor: The metric that decides the best checkpoint. Defaults to
            ``"loss"``.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (``"max"`` for a metric
            whose name holds ``"acc"`` or ``"auc"``, else ``"min"``).
            Defaults to ``"auto"``.
        epochs: The epochs of training: stop after the checkpoint of this
            epoch, or ``None``. Defaults to ``None``.
        max_evaluations: Stop after this many evaluations, or ``None``.
            Defaults to ``None``.
        idle_timeout: Stop when no new checkpoint came for this many
            seconds, or ``None`` to wait for SIGTERM. Defaults to ``None``.
        poll_interval: Seconds between two looks at the directory. Defaults
            to 1.0.

    Raises:
        ValueError: If `filepath` has fields in its directory, or `mode`,
            `epochs`, `max_evaluations`, `idle_timeout` or `poll_interval` is
            invalid.
    """

    def __init__(
        self,
        model: keras.Model,
        x: Any = None,
        y: Any = None,
        *,
        filepath: str,
        batch_size: int | None = None,
        steps: int | None = None,
        sample_weight: Any = None,
        log_dir: str | None = None,
        best_filepath: str | None = None,
        monitor: str = "loss",
        mode: str = "auto",
        epochs: int | None = None,
        max_evaluations: int | None = None,
        idle_timeout: float | None = None,
        poll_interval: float = 1.0,
    ):
        self.filepath = os.fspath(filepath)
        name_regex(self.filepath)  # checks the pattern now
        if mode not in ("auto", "min", "max"):
            raise ValueError(
                f'`mode` must be "auto", "min" or "max". Received: mode={mode!r}'
            )
        for name, value in (("epochs", epochs), ("max_evaluations", max_evaluations)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"`{name}` must be an integer >= 1 or None. "
                    f"Received: {name}={value!r}"
                )
        if not poll_interval > 0:
            raise ValueError(
                "`poll_interval` must be > 0. "
                f"Received: poll_interval={poll_interval!r}"
            )
        if idle_timeout is not None and not idle_timeout > 0:
            raise ValueError(
                "`idle_timeout` must be > 0 or None. "
                f"Received: idle_timeout={idle_timeout!r}"
            )
        if mode == "auto":
            mode = "max" if "acc" in monitor or "auc" in monitor else "min"
        self.model = model
        self.data = dict(
            x=x, y=y, batch_size=batch_size, steps=steps, sample_weight=sample_weight
        )
        self.log_dir = log_dir
        self.best_filepath = best_filepath
        self.monitor, self.mode = monitor, mode
        self.epochs, self.max_evaluations = epochs, max_evaluations
        self.poll_interval, self.idle_timeout = poll_interval, idle_timeout
        self.results: list[dict[str, Any]] = []
        self._best: float | None = None
        self._stop = threading.Event()

    @property
    def _log_path(self) -> str | None:
        return None if self.log_dir is None else os.path.join(self.log_dir, LOG_NAME)

    def _evaluated_before(self) -> set[tuple[str, int]]:
        """The checkpoints in the log; the best of them becomes the one to beat."""
        path = self._log_path
        if path is None or not os.path.exists(path):
            return set()
        with open(path) as log:
            results = [json.loads(line) for line in log if line.strip()]
        for result in results:
            if self._better(result["metrics"].get(self.monitor)):
                self._best = result["metrics"][self.monitor]
        return {(r["checkpoint"], r["modified_ns"]) for r in results}

    def _better(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False
        if self._best is None:
            return True
        return value < self._best if self.mode == "min" else value > self._best

    def _done(self) -> bool:
        last = self.results[-1] if self.results else None
        return bool(
            (self.max_evaluations and len(self.results) >= self.max_evaluations)
            or (self.epochs and last and (last["epoch"] or 0) >= self.epochs)
        )

    def evaluate_checkpoint(self, path: str) -> dict[str, Any]:
        """Evaluates the checkpoint at `path` and records the result.

        Args:
            path: A checkpoint written to `filepath`.

        Returns:
            ``{"checkpoint": path, "modified_ns": ..., "epoch": ...,
            "metrics": {...}, "seconds": ...}``: the file's modification time
            (a checkpoint rewritten at the same path is evaluated again), and
            ``epoch`` ``None`` when `filepath` has no ``{epoch}`` field.
        """
        start = time.monotonic()
        modified_ns = os.stat(path).st_mtime_ns
        with warnings.catch_warnings():
            # A `.keras` file holds the optimizer's state too, which an
            # evaluation neither needs nor builds.
            warnings.filterwarnings(
                "ignore", "Skipping variable loading for optimizer", UserWarning
            )
            self.model.load_weights(path)
        metrics = self.model.evaluate(**self.data, verbose=0, return_dict=True)
        result = dict(
            checkpoint=path,
            modified_ns=modified_ns,
            epoch=checkpoint_epoch(path, self.filepath),
            metrics={name: float(value) for name, value in metrics.items()},
            seconds=round(time.monotonic() - start, 3),
        )
        self.results.append(result)
        self._write_logs(result)
        self._keep_if_best(result)
        return result

    def _write_logs(self, result: dict[str, Any]) -> None:
        if self.log_dir is None:
            return
        os.makedirs(self.log_dir, exist_ok=True)
        with open(self._log_path, "a") as log:
            log.write(json.dumps(result) + "\n")
        step = (result["epoch"] or len(self.results)) - 1
        writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "validation"))
        with writer.as_default():
            for name, value in result["metrics"].items():
                tf.summary.scalar(f"epoch_{name}", value, step=step)
        writer.close()

    def _keep_if_best(self, result: dict[str, Any]) -> None:
        value = result["metrics"].get(self.monitor)
        if self.best_filepath is not None and self._better(value):
            self._best = value
            write_atomically(
                self.best_filepath,
                lambda temp: shutil.copyfile(result["checkpoint"], temp),
            )

    @staticmethod
    def _launcher_done() -> bool:
        done_file = os.environ.get(TRAINING_DONE_VARIABLE)
        return bool(done_file) and os.path.exists(done_file)

    def stop(self) -> None:
        """Makes `start` return once the checkpoints written so far are evaluated.

        SIGTERM does the same when `start` runs in the main thread.
        """
        self._stop.set()

    def start(self) -> list[dict[str, Any]]:
        """Evaluates each new checkpoint until training has ended.

        Returns:
            The results of this run, oldest first (see `evaluate_checkpoint`).
        """
        done = self._evaluated_before()
        last_new = time.monotonic()
        with _stop_on_sigterm(self._stop):
            while True:
                # Read before listing: what was written before the signal is
                # then in the listing.
                ended = self._stop.is_set() or self._launcher_done()
                for path in list_checkpoints(self.filepath):
                    try:
                        key = (path, os.stat(path).st_mtime_ns)
                    except OSError:  # replaced since the listing
                        continue
                    if key in done:
                        continue
                    result = self.evaluate_checkpoint(path)
                    done.add((path, result["modified_ns"]))
                    last_new = time.monotonic()
                    if self._done():
                        return self.results
                idle = time.monotonic() - last_new
                if ended or (self.idle_timeout and idle >= self.idle_timeout):
                    return self.results
                self._stop.wait(self.poll_interval)
