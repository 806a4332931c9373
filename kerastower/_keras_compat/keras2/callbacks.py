"""Keras 2 callback and optimizer internals used by kerastower.

The Keras 3 counterparts are in `kerastower._keras_compat.callbacks`.
kerastower's checkpointing callbacks (`ChiefCheckpoint`,
`BackupAndRestore`) decide when to save and where to resume through hooks
that are not ported to Keras 2 yet: those raise a clear error.
"""

from __future__ import annotations

import re

from kerastower._keras_compat.checkpoints import CheckpointRouting
from kerastower._keras_compat.errors import KerasCompatibilityError, _attribute
from kerastower._keras_compat.family import describe
from kerastower._keras_compat.keras2.internals import internal

_io_utils = internal("utils.io_utils", "print_msg")

# Keras's own test for a path it must not treat as local (its `file_utils`).
_REMOTE = re.compile(r"^(/cns|/cfs|/gcs|/hdfs|/readahead|.*://).*$")


def _not_yet(what: str) -> KerasCompatibilityError:
    return KerasCompatibilityError(
        f"{what} is not supported on Keras 2 yet ({describe()}): use Keras 3, "
        "or Keras's own callback."
    )


def is_remote_path(path) -> bool:
    """Whether Keras treats `path` as remote (``gs://``, ``hdfs://``, ...)."""
    return bool(_REMOTE.match(str(path)))


def print_msg(message: str) -> None:
    """Prints as Keras's callbacks do (to its logger when it has one)."""
    _io_utils.print_msg(message)


def set_initial_epoch(model, epoch: int | None) -> None:
    """Not supported on Keras 2 yet: Keras 2 resumes through its own
    training state, not ``model._initial_epoch``."""
    del model, epoch
    raise _not_yet("Resuming `fit` at a saved epoch")


class CheckpointHooks(CheckpointRouting):
    """`CheckpointRouting`, and Keras's decision whether to save."""

    def should_save(self, epoch: int, batch: int | None, logs, path: str) -> bool:
        """Not supported on Keras 2 yet: raises."""
        del epoch, batch, logs, path
        raise _not_yet(f"`{type(self).__name__}`")


def learning_rate_slot(optimizer):
    """The optimizer's learning rate as it holds it: a variable or a schedule."""
    return _attribute(optimizer, "_learning_rate", "Optimizer")


def check_execution_steps(model, callback: str) -> None:
    """Nothing to check: Keras 2 tells callbacks the last step of each
    execution, as Keras 3.11 and newer do."""
    del model, callback
