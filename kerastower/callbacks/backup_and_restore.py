"""`BackupAndRestore`: resumable training, mid-epoch and on preemption, exactly."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from collections.abc import Sequence

import numpy as np

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.callbacks.backup_files import (
    POINTER,
    check_global_batch,
    read_backup,
    write_backup,
)
from kerastower.callbacks.checkpoint_files import TEMP_PREFIX, remove_leftovers
from kerastower.callbacks.counting import loss_count
from kerastower.reduce import workers
from kerastower.workers import cluster


class BackupAndRestore(keras.callbacks.Callback):
    """Backs training up, and resumes it at the very step it stopped.

    A drop-in for `keras.callbacks.BackupAndRestore` that resumes exactly:
    the resumed run ends with the weights, optimizer state, metrics and
    history of the run never interrupted, also when it stopped in the middle
    of an epoch or of a `GradientAccumulation` window.

    A backup holds the model's weights and optimizer state, the position in
    training (epoch and step), the state of every metric of the running epoch
    and the `GradientAccumulation` window (its sums, examples and step). On
    resume, `fit` starts at that epoch; the steps the epoch had already run
    are skipped (their batches are drawn from the data and dropped, so the
    data position is restored: needs data whose order depends only on the
    epoch, e.g. ``shuffle=False`` or a seeded `tf.data` pipeline), the
    metrics and the window are restored, and training goes on. Keras's own
    callback restarts an interrupted epoch from its first step instead.

    **Preemption.** On one of `signals` (``SIGTERM`` by default: what cloud
    schedulers and Kubernetes send before they stop a machine), or once
    `preemption_file` exists, training stops at the end of the current step:
    a backup of that step is written and the process exits with `exit_code`.
    If that takes longer than `grace_period` seconds from the signal, the
    process exits anyway (the previous backup stays intact). Under several
    workers, every worker stops at the same step even when only one was
    signalled (the workers agree every `check_freq` steps, through an
    all-reduce of one number), only the chief writes, and every worker exits.

    Backups are written atomically: the files of a backup are flushed to
    disk before `latest.json` is switched to them, so a process killed at
    any moment leaves the previous backup whole. `backup_dir` must be on a
    file system every worker sees.

    Example:

    ```python
    import keras
    import numpy as np

    import kerastower

    inputs = keras.Input((8,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(640, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    backup = kerastower.callbacks.BackupAndRestore("backup", save_freq=5)
    model.fit(x, y, batch_size=64, epochs=10, shuffle=False, callbacks=[backup])
    # Killed or preempted? Run the same script again: it goes on from the
    # last backup (every 5 steps, and at the step a SIGTERM arrived).
    ```

    Args:
        backup_dir: The directory for the backup.
        save_freq: ``"epoch"`` to back up after each epoch, or an integer
            ``n`` to back up every ``n`` training steps (global batches).
            Defaults to ``"epoch"``.
        delete_checkpoint: Whether to delete the backup when training ends
            normally. Defaults to ``True``.
        signals: The signals that mean preemption. Defaults to
            ``(signal.SIGTERM,)``; ``()`` turns signal handling off.
        preemption_file: A path whose appearance means preemption (as a
            cloud maintenance-event watcher may write), or ``None``.
        grace_period: Seconds from a preemption signal to the latest exit.
            Defaults to 25 (the usual grace is 30 s).
        exit_code: The exit status after a preemption backup, or ``None`` to
            stop training without exiting (`fit` then returns early).
            Defaults to 143, the status of a process stopped by ``SIGTERM``.
        check_freq: Under several workers, the number of steps between two
            agreements on preemption (counted from the start of `fit`, over
            epochs). A signalled worker may run up to ``check_freq - 1``
            more steps, so keep ``check_freq`` times the step time well
            under `grace_period`. One worker checks after every step.
            Defaults to 1.

    Raises:
        ValueError: If an argument is invalid, or a backup does not fit the
            model (another model, other metrics).
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike,
        save_freq: str | int = "epoch",
        delete_checkpoint: bool = True,
        signals: Sequence[int] = (signal.SIGTERM,),
        preemption_file: str | os.PathLike | None = None,
        grace_period: float = 25.0,
        exit_code: int | None = 143,
        check_freq: int = 1,
    ):
        super().__init__()
        if not backup_dir:
            raise ValueError(
                "`backup_dir` must be a directory path. "
                f"Received: backup_dir={backup_dir!r}"
            )
        if save_freq != "epoch" and (
            not isinstance(save_freq, int)
            or isinstance(save_freq, bool)
            or save_freq < 1
        ):
            raise ValueError(
                "`save_freq` must be 'epoch' or an integer >= 1. "
                f"Received: save_freq={save_freq!r}"
            )
        if (
            isinstance(grace_period, bool)
            or not isinstance(grace_period, (int, float))
            or not grace_period > 0
        ):
            raise ValueError(
                f"`grace_period` must be > 0. Received: grace_period={grace_period!r}"
            )
        if exit_code is not None and (
            isinstance(exit_code, bool) or not isinstance(exit_code, int)
        ):
            raise ValueError(
                "`exit_code` must be an integer or None. "
                f"Received: exit_code={exit_code!r}"
            )
        if (
            isinstance(check_freq, bool)
            or not isinstance(check_freq, int)
            or (check_freq < 1)
        ):
            raise ValueError(
                "`check_freq` must be an integer >= 1. "
                f"Received: check_freq={check_freq!r}"
            )
        valid = {int(s) for s in signal.Signals}
        if isinstance(signals, (str, bytes, int)) or any(
            isinstance(s, bool) or not isinstance(s, int) or int(s) not in valid
            for s in signals
        ):
            raise ValueError(
                "`signals` must be a sequence of signal numbers, such as "
                f"(signal.SIGTERM,). Received: signals={signals!r}"
            )
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self.signals = tuple(signals)
        self.preemption_file = (
            None if preemption_file is None else os.fspath(preemption_file)
        )
        self.grace_period = float(grace_period)
        self.exit_code = exit_code
        self.check_freq = check_freq
        self.preempted = False
        self._unchecked_steps = 0
        self._signalled = threading.Event()
        self._previous_handlers: dict = {}
        self._pending: dict | None = None  # the restored state, until applied
        self._epoch = 0
        self._step = 0  # steps run in this epoch
        self._saved_step = 0  # the step of the epoch's latest backup

    # -- what a backup holds --------------------------------------------

    def _metric_variables(self):
        return [v for m in self.model.metrics for v in m.variables]

    def _window_variables(self):
        accumulator = getattr(self.model, "gradient_accumulator", None)
        if accumulator is None:
            return []
        return accumulator.state()

    def _save(self, epoch: int, step: int) -> None:
        """Backs up the state after `step` steps of `epoch` (chief writes)."""
        if not cluster.is_chief(self.model.distribute_strategy):
            return
        metrics = [np.asarray(v.numpy()) for v in self._metric_variables()]
        window = [np.asarray(v.numpy()) for v in self._window_variables()]
        position = dict(epoch=epoch, step=step, metrics=len(metrics))
        position.update(window=len(window), global_batch=self._global_batch)
        write_backup(self.backup_dir, self.model, metrics + window, position)

    # -- restoring ----------------------------------------------------------

    def on_train_begin(self, logs=None):
        _keras_compat.check_execution_steps(self.model, "BackupAndRestore")
        self.preempted = False
        self._unchecked_steps = 0
        self._signalled.clear()
        self._install_handlers()
        self._pending = None
        self._global_batch = self._counted = None
        self._skipped = 0
        if cluster.is_chief(self.model.distribute_strategy):
            remove_leftovers(self.backup_dir)  # writes a kill cut short
        if not os.path.exists(os.path.join(self.backup_dir, POINTER)):
            return
        model = self.model
        if not model.built:
            raise ValueError(
                "BackupAndRestore needs a built model to restore the backup into. "
                f"Received: unbuilt model {model.name!r}"
            )
        if model.optimizer is not None:
            _keras_compat.build_optimizer(model.optimizer, model.trainable_variables)
        state = read_backup(self.backup_dir, model)
        self._global_batch = state.get("global_batch")
        self._pending = state
        _keras_compat.set_initial_epoch(model, state["epoch"])

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._step, self._saved_step = epoch, 0, 0
        state, self._pending = self._pending, None
        self._counted, self._skipped = 0, 0  # the loss metric's count; steps
        if state is None or state["epoch"] != epoch:
            return
        self._saved_step = self._skipped = state["step"]
        unmade = _keras_compat.metrics_made_in_first_step()
        if self._metric_variables() or not state["metrics"] or not unmade:
            self._restore(state)
            self._skip(state["step"])
        elif state["step"] == 0:  # nothing counted yet: nothing to restore
            values = state["values"][state["metrics"] :]
            self._restore(dict(state, metrics=0, values=values))
        else:
            # Keras 2 makes its compiled metrics in the first step: they
            # are made from the first batch skipped, then restored.
            self._skip(state["step"], restore=state)

    def _restore(self, state: dict) -> None:
        """Assigns the backup's metric and accumulation state."""
        metrics = self._metric_variables()
        window = self._window_variables()
        if (len(metrics), len(window)) != (state["metrics"], state["window"]):
            raise ValueError(
                "The backup does not fit this training: it holds "
                f"{state['metrics']} metric and {state['window']} accumulation "
                f"variables, the model has {len(metrics)} and {len(window)}. "
                f"Received: backup_dir={self.backup_dir}"
            )
        for variable, value in zip(metrics + window, state["values"]):
            variable.assign(value)

    def _skip(self, steps: int, restore: dict | None = None) -> None:
        """Draws and drops the batches of the `steps` steps already run;
        builds the metrics from the first and `_restore`s `restore` then."""
        if steps <= 0:
            return
        model = self.model
        train = model.train_function
        remaining = steps

        def skipped(iterator):
            nonlocal remaining, restore
            if remaining <= 0:
                model.train_function = train
                return train(iterator)
            for _ in range(min(_keras_compat.steps_per_execution(model), remaining)):
                batch = iterator.get_next()
                remaining -= 1
                if restore is not None:
                    _keras_compat.build_metrics(model, batch)
                    self._restore(restore)
                    restore = None
            return model.get_metrics_result()

        model.train_function = skipped

    # -- backing up -------------------------------------------------------

    def on_train_batch_end(self, batch, logs=None):
        self._step = batch + 1  # `batch` is the last step of the execution
        self._check_global_batch()
        if self._preemption_agreed():
            self._save(self._epoch, self._step)
            self.preempted = True
            if self.exit_code is None:
                self.model.stop_training = True
                return
            raise SystemExit(self.exit_code)
        if self.save_freq != "epoch" and (
            self._step - self._saved_step >= self.save_freq
        ):
            self._save(self._epoch, self._step)
            self._saved_step = self._step

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch" and not self.model.stop_training:
            self._save(epoch + 1, 0)

    def on_train_end(self, logs=None):
        self._restore_handlers()
        if self.preempted or not self.delete_checkpoint:
            return
        if not cluster.is_chief(self.model.distribute_strategy):
            return
        remove_leftovers(self.backup_dir, (POINTER, "backup-", TEMP_PREFIX))
        try:
            os.rmdir(self.backup_dir)  # only when nothing else is there
        except OSError:
            pass

    def _check_global_batch(self) -> None:
        """Records the global batch, or checks it against the backup's.

        A resumed run must take as many examples a step as the run it
        resumes; steps of one worker count alone would not show another
        number of workers, so this counts all workers' (the loss metric).
        """
        if self._counted is False or self._step < self._skipped:
            return  # checked, nothing to count, or a restored step skipped
        count = loss_count(self.model)
        last, self._counted = self._counted, count
        if count is None or self._step == self._skipped:
            self._counted = False if count is None else count
            return
        steps = self.params.get("steps") if self.params else None
        last_step = steps is not None and self._step >= steps
        if self._global_batch is None:
            if not last_step:  # a short last step is no full batch
                self._global_batch, self._counted = count - last, False
            return
        check_global_batch(self.backup_dir, self._global_batch, count - last, last_step)
        if not last_step:
            self._counted = False

    # -- preemption ---------------------------------------------------------

    def _preemption_agreed(self) -> bool:
        local = self._signalled.is_set() or bool(
            self.preemption_file and os.path.exists(self.preemption_file)
        )
        model = self.model
        if getattr(model, "num_workers", 1) > 1:
            self._unchecked_steps += 1
            if self._unchecked_steps < self.check_freq:
                return False
            self._unchecked_steps = 0
            flag = np.float32(1.0 if local else 0.0)
            total = workers.all_reduce_sum(model.worker_strategy, flag)
            return float(total) > 0
        return local

    def _on_signal(self, signum, frame):
        if self._signalled.is_set():
            return
        self._signalled.set()
        # The last resort: exit even if the step or the backup hangs.
        code = 128 + signum if self.exit_code is None else self.exit_code
        timer = threading.Timer(self.grace_period, os._exit, args=(code,))
        timer.daemon = True
        timer.start()

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            if self.signals:
                warnings.warn(
                    "BackupAndRestore handles signals in the main thread only; "
                    "fit runs in another thread, so signals are not handled.",
                    stacklevel=3,
                )
            return
        for signum in self.signals:
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}
