"""Heartbeats: what each worker is doing, for the launcher to report.

Under ``kerastower launch`` every worker gets ``KERASTOWER_HEARTBEAT_FILE``,
and `TowerModel.fit` then records, at the start and end of every batch, the
phase (``train`` or ``test``), the epoch, the batch and the time in that
file. When a worker fails or stops answering (the others wait for it in a
collective, which fails when TensorFlow's heartbeats find it dead or after
the collective timeout, if one is set), the launcher reports
each worker's last record: "in train batch 4 of epoch 0" is a worker waiting
inside a step (in an all-reduce, say), "after train batch 3 of epoch 0" one
that is busy or stuck outside the steps (a callback, the input pipeline).

The record is a fixed-size JSON text in a memory-mapped file: writing it
costs a few microseconds and no system call, and the launcher reads it
without TensorFlow. Plain Python: `heartbeat_callback` imports Keras only
when it is called.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from typing import Any

HEARTBEAT_VARIABLE = "KERASTOWER_HEARTBEAT_FILE"
"""The environment variable that names a worker's heartbeat file."""

RECORD_BYTES = 256
_RECORDS: dict[str, _Record] = {}  # one open map per file, for every `fit`


def describe(path: str, now: float | None = None) -> str | None:
    """The last record of the heartbeat file at `path`, in words.

    Args:
        path: A heartbeat file.
        now: The current `time.time()`; defaults to now.

    Returns:
        For example ``"in train batch 4 of epoch 0, 12.3 s ago"``, or
        ``None`` when the file holds no record (the worker never began a
        batch of `fit`).
    """
    try:
        with open(path, "rb") as file:
            raw = file.read(RECORD_BYTES)
        record = json.loads(raw.rstrip(b"\0 ").decode())
    except (OSError, ValueError):
        return None
    now = time.time() if now is None else now
    where = "in" if record["state"] == "begin" else "after"
    return (
        f"{where} {record['phase']} batch {record['batch']} of epoch "
        f"{record['epoch']}, {now - record['time']:.1f} s ago"
    )


class _Record:
    """A memory-mapped heartbeat file that one process writes."""

    def __init__(self, path: str):
        with open(path, "wb") as file:
            file.write(b"\0" * RECORD_BYTES)
        self._file = open(path, "r+b")  # noqa: SIM115 - kept for the mmap
        self._map = mmap.mmap(self._file.fileno(), RECORD_BYTES)

    def write(self, **record: Any) -> None:
        text = json.dumps(record).encode()[:RECORD_BYTES]
        self._map[:RECORD_BYTES] = text.ljust(RECORD_BYTES, b"\0")


def heartbeat_callback():
    """The callback that `TowerModel.fit` adds under the launcher, else ``None``.

    Returns:
        A `keras.callbacks.Callback` that writes this worker's heartbeat
        file (``$KERASTOWER_HEARTBEAT_FILE``) at the start and end of every
        train and test batch, or ``None`` when the variable is not set.
    """
    path = os.environ.get(HEARTBEAT_VARIABLE)
    if not path:
        return None
    from kerastower._keras_compat.family import keras

    if path not in _RECORDS:
        _RECORDS[path] = _Record(path)
    record = _RECORDS[path]

    class Heartbeat(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def _write(self, phase, state, batch):
            record.write(
                phase=phase,
                state=state,
                epoch=self.epoch,
                batch=batch,
                time=time.time(),
            )

        def on_train_batch_begin(self, batch, logs=None):
            self._write("train", "begin", batch)

        def on_train_batch_end(self, batch, logs=None):
            self._write("train", "end", batch)

        def on_test_batch_begin(self, batch, logs=None):
            self._write("test", "begin", batch)

        def on_test_batch_end(self, batch, logs=None):
            self._write("test", "end", batch)

    return Heartbeat()
