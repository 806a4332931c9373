"""The files of a `BackupAndRestore` backup: writing them whole, reading them back.

A backup is three files in the backup directory: ``backup-<id>.weights.h5``
(the model's weights and optimizer state, `keras.Model.save_weights`),
``backup-<id>.npz`` (the metric and accumulation variables, in order) and
``latest.json``, the pointer, which names the other two and holds the
position in training: epoch, step and the global batch size. Each file is
written atomically and the pointer last, so a process killed at any moment
leaves the previous backup whole.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from kerastower.callbacks.checkpoint_files import (
    fsync,
    remove_quietly,
    write_atomically,
)

POINTER = "latest.json"
"""The file naming the latest complete backup; it is replaced atomically."""

_KEYS = ("id", "epoch", "step", "weights", "arrays", "metrics", "window")


def write_backup(
    backup_dir: str,
    model: Any,
    arrays: Sequence[np.ndarray],
    position: dict[str, Any],
) -> None:
    """Writes a backup of `model`, `arrays` and `position`, then drops the last.

    `position` holds ``epoch``, ``step``, ``metrics`` and ``window`` (how
    many of `arrays` are metric and accumulation variables) and
    ``global_batch`` (examples per full step, or ``None``).
    """
    os.makedirs(backup_dir, exist_ok=True)
    previous = read_pointer(backup_dir)
    backup_id = previous["id"] + 1 if previous else 0
    state = dict(
        position,
        id=backup_id,
        weights=f"backup-{backup_id}.weights.h5",
        arrays=f"backup-{backup_id}.npz",
    )
    write_atomically(
        os.path.join(backup_dir, state["weights"]),
        lambda path: model.save_weights(path, overwrite=True),
    )

    def save_arrays(path):
        with open(path, "wb") as f:
            np.savez(f, *arrays)

    def save_pointer(path):
        with open(path, "w") as f:
            json.dump(state, f)

    write_atomically(os.path.join(backup_dir, state["arrays"]), save_arrays)
    write_atomically(os.path.join(backup_dir, POINTER), save_pointer)
    fsync(backup_dir, directory=True)
    if previous:
        for name in (previous["weights"], previous["arrays"]):
            remove_quietly(os.path.join(backup_dir, name))


def read_pointer(backup_dir: str) -> dict[str, Any] | None:
    """The latest backup's pointer, or ``None`` when there is no backup.

    Raises:
        ValueError: If the pointer is not one that `write_backup` wrote.
    """
    path = os.path.join(backup_dir, POINTER)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            state = json.load(f)
        missing = [key for key in _KEYS if key not in state]
    except (OSError, ValueError, TypeError) as error:
        missing = [f"a readable JSON object ({error})"]
    if missing:
        raise ValueError(
            f"The backup pointer {path} is damaged: it lacks {', '.join(missing)}. "
            "Backups are written atomically, so something else wrote or cut "
            f"this file; remove {backup_dir} to start training anew. "
            f"Received: backup_dir={backup_dir}"
        )
    return state


def read_backup(backup_dir: str, model: Any) -> dict[str, Any] | None:
    """Loads the latest backup's weights into `model`; returns its state.

    The state is the pointer's, with ``values``: the arrays of the backup.

    Raises:
        ValueError: If the backup is damaged or was written by another
            model, naming the file and what failed.
    """
    state = read_pointer(backup_dir)
    if state is None:
        return None
    weights = os.path.join(backup_dir, state["weights"])
    arrays = os.path.join(backup_dir, state["arrays"])
    try:
        model.load_weights(weights)
    except Exception as error:  # Keras raises several types for this
        raise ValueError(
            f"The backup {weights} does not load into this model: another "
            "model wrote it, or the file is damaged. Resume with the model "
            f"that was backed up, or remove {backup_dir} to start anew. "
            f"Received: {type(error).__name__}: {error}"
        ) from error
    try:
        with np.load(arrays) as data:
            state["values"] = [data[f"arr_{i}"] for i in range(len(data.files))]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(
            f"The backup {arrays} is damaged ({error}); remove {backup_dir} "
            "to start training anew."
        ) from error
    return state


def check_global_batch(
    backup_dir: str, backed_up: int, size: int, last_step: bool
) -> None:
    """Refuses a step whose global batch differs from the backed-up run's.

    A step of `size` examples may be smaller than `backed_up` only as the
    last step of its epoch.

    Raises:
        ValueError: If the resumed run's global batch is another.
    """
    if size > backed_up or (size < backed_up and not last_step):
        raise ValueError(
            f"The run backed up in {backup_dir} took {backed_up} examples a "
            f"step (all workers' batches together); this one takes {size}, so "
            "it would train another model. To resume on another number of "
            "workers, keep the global batch: give each of the W workers "
            "`batch_size=global_batch // W` of the data shared out by "
            "`kerastower.cluster.shard`. Received: global batch "
            f"{size}, backed up {backed_up}"
        )
