"""Keras callback, optimizer and strategy internals used by kerastower."""

from __future__ import annotations

import warnings

import numpy as np
import tensorflow as tf

from kerastower._keras_compat.checkpoints import CheckpointRouting
from kerastower._keras_compat.errors import KERAS_MINOR, _attribute, _fail, check_method
from kerastower._keras_compat.family import KERAS_VERSION, keras

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


def _import_utils():
    try:
        from keras.src.utils import file_utils, io_utils
    except ImportError as error:  # pragma: no cover - depends on Keras
        raise _fail("keras.src.utils.file_utils", "cannot be imported") from error
    for module, name in ((file_utils, "is_remote_path"), (io_utils, "print_msg")):
        if not callable(getattr(module, name, None)):  # pragma: no cover
            raise _fail(f"{module.__name__}.{name}", "is missing")
    return file_utils, io_utils


_file_utils, _io_utils = _import_utils()


def is_remote_path(path) -> bool:
    """Whether Keras treats `path` as remote (``gs://``, ``hdfs://``, ...)."""
    return bool(_file_utils.is_remote_path(path))


def keras_files_hold_optimizer() -> bool:
    """Whether ``model.save("m.keras")`` writes a file whose `load_weights`
    restores the optimizer state too: always on Keras 3."""
    return True


def print_msg(message: str) -> None:
    """Prints as Keras's callbacks do (to its logger when it has one)."""
    _io_utils.print_msg(message)


def set_initial_epoch(model, epoch: int | None) -> None:
    """Makes `fit` start at `epoch` when set in ``on_train_begin`` (``None``
    clears it), as `keras.callbacks.BackupAndRestore` does."""
    _attribute(model, "_initial_epoch", "Trainer")
    model._initial_epoch = epoch


class CheckpointHooks(CheckpointRouting):
    """`CheckpointRouting`, and Keras's decision whether to save."""

    def should_save(self, epoch: int, batch: int | None, logs, path: str) -> bool:
        """Whether Keras's rules (``save_best_only``, ...) save this one."""
        if _HAS_SHOULD_SAVE:
            return self._should_save_model(epoch, batch, logs, path)
        return _should_save_before_3_10(self, epoch, logs or {}, path)


# Keras 3.8 and 3.9 decide inside `_save_model`; 3.10 moved the decision into
# `_should_save_model`. `_should_save_before_3_10` is 3.9's decision, word for
# word in its effects: a missing `monitor` skips the save (3.10 saves).
_HAS_SHOULD_SAVE = KERAS_MINOR >= (3, 10)


def _should_save_before_3_10(callback, epoch: int, logs: dict, path: str) -> bool:
    if not callback.save_best_only:
        if callback.verbose > 0:
            print_msg(f"\nEpoch {epoch + 1}: saving model to {path}")
        return True
    current = logs.get(callback.monitor)
    if current is None:
        warnings.warn(
            f"Can save best model only with {callback.monitor} available, skipping.",
            stacklevel=3,
        )
        return False
    if (isinstance(current, np.ndarray) or tf.is_tensor(current)) and len(
        current.shape
    ) > 0:
        warnings.warn(
            "Can save best model only when `monitor` is a scalar value. "
            f"Received: {current}. Falling back to `save_best_only=False`.",
            stacklevel=3,
        )
        return True
    # `best` is None only on the newer Keras this is tested on (3.10 starts
    # from None; 3.8 and 3.9 from an infinity).
    best = callback.best
    best_text = "None" if best is None else f"{best:.5f}"
    if best is None or _attribute(callback, "monitor_op", "ModelCheckpoint")(
        current, best
    ):
        if callback.verbose > 0:
            print_msg(
                f"\nEpoch {epoch + 1}: {callback.monitor} improved from "
                f"{best_text} to {current:.5f}, saving model to {path}"
            )
        callback.best = current
        return True
    if callback.verbose > 0:
        print_msg(
            f"\nEpoch {epoch + 1}: {callback.monitor} did not improve from {best_text}"
        )
    return False


def _check_checkpoint_hooks() -> None:
    expected = {
        "_save_model": ["self", "epoch", "batch", "logs"],
        "_get_file_path": ["self", "epoch", "batch", "logs"],
    }
    if _HAS_SHOULD_SAVE:
        expected["_should_save_model"] = ["self", "epoch", "batch", "logs", "filepath"]
    for name, parameters in expected.items():
        check_method(
            keras.callbacks.ModelCheckpoint, name, parameters, "ModelCheckpoint"
        )


_check_checkpoint_hooks()


def learning_rate_slot(optimizer):
    """The optimizer's learning rate as it holds it: a variable or a schedule.

    Keras has no public way to tell a schedule from a variable rate.
    """
    return _attribute(optimizer, "_learning_rate", "Optimizer")


# Keras 3.11 passes callbacks the first step of an execution at its start
# and its last step at its end; Keras 3.10 passes the first step to both.
_REPORTS_LAST_STEP = KERAS_MINOR >= (3, 11)


def steps_per_execution(model) -> int:
    """The training steps Keras runs per execution of its step function."""
    return int(getattr(model, "steps_per_execution", 1))


def check_execution_steps(model, callback: str) -> None:
    """Raises if `callback` cannot count the steps of an execution.

    Args:
        model: The model being trained.
        callback: The callback's class name, for the message.

    Raises:
        ValueError: On Keras 3.10, where a callback is told only the first
            step of each execution, with ``steps_per_execution > 1``.
    """
    steps = steps_per_execution(model)
    if not _REPORTS_LAST_STEP and steps > 1:
        raise ValueError(
            f"`{callback}` counts the steps of each execution, which Keras "
            f"{KERAS_VERSION} does not tell callbacks (Keras 3.11 and newer "
            "do): upgrade Keras, or compile with `steps_per_execution=1`. "
            f"Received: steps_per_execution={steps}"
        )
