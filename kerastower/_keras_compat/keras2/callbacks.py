"""Keras 2 callback and optimizer internals used by kerastower.

The Keras 3 counterparts are in `kerastower._keras_compat.keras3.callbacks`. Keras 2
decides whether to save inside ``ModelCheckpoint._save_model`` (`should_save`
is that decision), and starts `fit` at the epoch that
``Model._maybe_load_initial_counters_from_ckpt`` returns after
``on_train_begin`` (`set_initial_epoch` answers it).
"""

from __future__ import annotations

import re
import warnings

import tensorflow as tf

from kerastower._keras_compat.checkpoints import CheckpointRouting
from kerastower._keras_compat.errors import _attribute, check_method
from kerastower._keras_compat.keras2.internals import internal

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "CheckpointHooks",
    "check_execution_steps",
    "is_remote_path",
    "keras_files_hold_optimizer",
    "learning_rate_slot",
    "print_msg",
    "set_initial_epoch",
    "steps_per_execution",
]

_io_utils = internal("utils.io_utils", "print_msg")
_saving_lib = internal("saving.saving_lib", "saving_v3_enabled")

# Keras's own test for a path it must not treat as local (its `file_utils`).
_REMOTE = re.compile(r"^(/cns|/cfs|/gcs|/hdfs|/readahead|.*://).*$")


def is_remote_path(path) -> bool:
    """Whether Keras treats `path` as remote (``gs://``, ``hdfs://``, ...)."""
    return bool(_REMOTE.match(str(path)))


def keras_files_hold_optimizer() -> bool:
    """Whether ``model.save("m.keras")`` writes Keras's zip format, whose
    `load_weights` restores the optimizer state too. Keras 2.12 writes HDF5
    there unless its v3 saving is enabled (``saving_lib.saving_v3_enabled``)."""
    return bool(_saving_lib.saving_v3_enabled())


def print_msg(message: str) -> None:
    """Prints as Keras's callbacks do (to its logger when it has one)."""
    _io_utils.print_msg(message)


def set_initial_epoch(model, epoch: int | None) -> None:
    """Makes `fit` start at `epoch` when set in ``on_train_begin`` (``None``
    clears it): Keras 2 asks ``_maybe_load_initial_counters_from_ckpt`` for
    the epoch and step to start at once the callbacks have begun."""
    hook = "_maybe_load_initial_counters_from_ckpt"
    check_method(
        type(model), hook, ["self", "steps_per_epoch", "initial_epoch"], "Model"
    )
    if epoch is None:
        vars(model).pop(hook, None)
        return
    setattr(model, hook, lambda steps_per_epoch, initial_epoch: (epoch, 0))


class CheckpointHooks(CheckpointRouting):
    """`CheckpointRouting`, and Keras 2's decision whether to save."""

    def _implements_train_batch_hooks(self):
        # Keras 2 skips a `ModelCheckpoint`'s batch hooks when it saves per
        # epoch; `ChiefCheckpoint` counts the batches of each epoch.
        return True

    def should_save(self, epoch: int, batch: int | None, logs, path: str) -> bool:
        """Whether Keras 2's rules (``period``, ``save_best_only``) save this
        one, with its messages (``ModelCheckpoint._save_model``)."""
        if not (
            isinstance(self.save_freq, int)
            or self.epochs_since_last_save >= self.period
        ):
            return False
        self.epochs_since_last_save = 0
        if not self.save_best_only:
            if self.verbose > 0:
                print_msg(f"\nEpoch {epoch + 1}: saving model to {path}")
            return True
        current = (logs or {}).get(self.monitor)
        if current is None:
            warnings.warn(
                f"Can save best model only with {self.monitor} available, skipping.",
                stacklevel=3,
            )
            return False
        current = float(current)
        if self.monitor_op(current, self.best):
            if self.verbose > 0:
                print_msg(
                    f"\nEpoch {epoch + 1}: {self.monitor} improved from "
                    f"{self.best:.5f} to {current:.5f}, saving model to {path}"
                )
            self.best = current
            return True
        if self.verbose > 0:
            print_msg(
                f"\nEpoch {epoch + 1}: {self.monitor} did not improve from "
                f"{self.best:.5f}"
            )
        return False


def learning_rate_slot(optimizer):
    """The optimizer's learning rate as it holds it: a variable or a schedule."""
    return _attribute(optimizer, "_learning_rate", "Optimizer")


def steps_per_execution(model) -> int:
    """The training steps Keras 2 runs per execution (a variable it keeps
    from `compile`; 1 before)."""
    steps = getattr(model, "_steps_per_execution", None)
    if steps is None:
        return 1
    with tf.init_scope():  # its value now, also while a step traces
        return int(steps.numpy())


def check_execution_steps(model, callback: str) -> None:
    """Nothing to check: Keras 2 tells callbacks the last step of each
    execution, as Keras 3.11 and newer do."""
    del model, callback
