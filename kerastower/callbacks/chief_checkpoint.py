"""`ChiefCheckpoint`: `ModelCheckpoint` that only the chief writes, atomically."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.callbacks.checkpoint_files import (
    TEMP_PREFIX,
    checkpoint_epoch,
    fsync,
    latest_checkpoint,
    name_regex,
    remove_leftovers,
    static_dir,
    write_atomically,
    write_error,
)
from kerastower.workers import cluster


class ChiefCheckpoint(_keras_compat.CheckpointHooks, keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` for multi-worker training.

    Every `ModelCheckpoint` option works as there (`monitor`, `mode`,
    `save_best_only`, `save_weights_only`, `save_freq`,
    `initial_value_threshold`, ``{epoch}``/``{batch}``/metric fields in
    `filepath`), with three differences:

    - **Only the chief writes `filepath`.** The chief is the ``"chief"`` task
      of `TF_CONFIG`, or worker 0 when there is none, and must also be the
      model's distribution strategy's ``should_checkpoint`` worker (see
      `kerastower.is_chief`). Without `TF_CONFIG` the process is the chief.
      Every worker still takes every save, in step: the other workers save
      into a private temporary directory that is deleted right away. With
      Keras 3 a ``.keras`` or ``.weights.h5`` save reads each variable's local
      value and needs no other worker, but under a multi-worker strategy a
      read may be a collective (a variable synchronised on read is reduced
      over all workers), and a save that only the chief entered would then
      wait forever. All workers see the same logs, so with `save_best_only`
      they all decide alike.
    - **Writes are atomic.** The chief saves into a hidden temporary file in
      the checkpoint's directory (its name starts with ``.kerastower-tmp-``),
      flushes it to disk, then renames it onto the real path with
      `os.replace`. A crash or a failing save leaves the previous file at the
      real path intact and no partial file behind; a process killed outright
      may leave a temporary file, which the next `on_train_begin` removes.
      Remote paths (``gs://``...) are written directly, since the store
      uploads each object whole.
    - **A cut-short epoch is not saved.** At the end of an epoch whose
      ``loss`` is NaN or infinite (as when `TerminateOnNaN` stops training),
      or that ran fewer batches than the epoch has (training stopped inside
      it), nothing is saved and a warning says so: such a checkpoint would
      hold broken weights or a partial epoch named as complete, and a
      resumed run would start from it.
    - **Errors are not skipped.** `on_train_begin` checks that the chief can
      create and write the checkpoint directory, and a save that fails raises
      an `OSError` naming the path.

    With ``resume=True``, `on_train_begin` restores the latest checkpoint
    matching `filepath` (see `latest_checkpoint`) into the model, optimizer
    state included, and training starts at the epoch after it: `fit`'s
    `initial_epoch` is set from the ``{epoch}`` field of the file name, as
    `keras.callbacks.BackupAndRestore` does. Call `fit` with the same
    `epochs` as the run that was interrupted. With deterministic data
    (``shuffle=False``, or a dataset whose order depends only on the epoch)
    the resumed run ends with the same weights as one never interrupted.
    Every worker reads the checkpoint, so under multi-worker training the
    directory must be on a file system they all see.

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

    checkpoint = kerastower.callbacks.ChiefCheckpoint(
        "ckpt/{epoch:03d}.keras", resume=True
    )
    model.fit(x, y, batch_size=64, epochs=10, callbacks=[checkpoint])
    # Run again after a crash: training goes on from the last epoch saved.
    ```

    Args:
        filepath: String or `PathLike`, the path to save to; it may contain
            ``{epoch}``, ``{batch}`` and `logs` fields. It must end in
            ``.weights.h5`` when `save_weights_only`, else in ``.keras`` (or
            legacy ``.h5``).
        monitor: The metric name to monitor, for `save_best_only`. Defaults to
            ``"val_loss"``.
        verbose: 0 (silent) or 1 (a message per save). Defaults to 0.
        save_best_only: Whether to save only when `monitor` improves.
            Defaults to ``False``.
        save_weights_only: Whether to save weights (and optimizer state) only,
            with `model.save_weights`, instead of the whole model. Defaults to
            ``False``.
        mode: ``"auto"``, ``"min"`` or ``"max"``: whether `monitor` improves
            by decreasing or increasing. Defaults to ``"auto"``.
        save_freq: ``"epoch"`` to save after each epoch, or an integer ``n``
            to save every ``n`` training batches (global batches, one step of
            all workers). Defaults to ``"epoch"``.
        initial_value_threshold: The "best" value of `monitor` to beat first,
            for `save_best_only`. Defaults to ``None``.
        resume: Whether `on_train_begin` restores the latest checkpoint and
            sets the epoch to start from. Needs ``{epoch}`` in the file name
            of `filepath`, ``save_freq="epoch"`` and a ``.keras`` or
            ``.weights.h5`` file (both hold the optimizer state). After a
            resume, `save_best_only` compares against
            `initial_value_threshold` again, not the best value of the
            interrupted run. Defaults to ``False``.

    Raises:
        ValueError: If `filepath` does not end as the format requires, if
            `save_freq` is neither ``"epoch"`` nor an integer, or if `resume`
            is set without the requirements above.
    """

    def __init__(
        self,
        filepath: str | os.PathLike,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        resume: bool = False,
    ):
        super().__init__(
            os.fspath(filepath),  # Keras 2 takes a string only
            monitor=monitor,
            verbose=verbose,
            save_best_only=save_best_only,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
            initial_value_threshold=initial_value_threshold,
        )
        if not isinstance(resume, bool):
            raise ValueError(f"`resume` must be a bool. Received: resume={resume!r}")
        self.resume = resume
        self._chief: bool | None = None
        self._resumed_epoch: int | None = None
        if resume:
            self._validate_resume()

    def _validate_resume(self) -> None:
        if self.save_freq != "epoch":
            raise ValueError(
                "`resume=True` needs `save_freq='epoch'`: Keras cannot start "
                "`fit` in the middle of an epoch. Received: "
                f"save_freq={self.save_freq!r}"
            )
        if not self.filepath.endswith((".keras", ".weights.h5")):
            raise ValueError(
                "`resume=True` needs a `.keras` or `.weights.h5` filepath, which "
                "hold the optimizer state (legacy `.h5` files do not). "
                f"Received: filepath={self.filepath}"
            )
        regex = name_regex(self.filepath)
        if "epoch" not in regex.groupindex:
            raise ValueError(
                "`resume=True` needs an `{epoch}` field in the file name of "
                "`filepath`, to know the epoch to resume from. Received: "
                f"filepath={self.filepath}"
            )
        if self.filepath.endswith(".keras") and not (
            _keras_compat.keras_files_hold_optimizer()
        ):
            raise ValueError(
                "`resume=True` with a `.keras` filepath needs Keras's zip "
                "format; this Keras (2.12) writes `.keras` files as HDF5, whose "
                "weights load without the optimizer state. Use a `.weights.h5` "
                "filepath with `save_weights_only=True`. Received: "
                f"filepath={self.filepath}"
            )

    @property
    def _remote(self) -> bool:
        return _keras_compat.is_remote_path(self.filepath)

    def _is_chief(self) -> bool:
        if self._chief is None:
            self._chief = cluster.is_chief(self.model.distribute_strategy)
        return self._chief

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._batches_seen = 0
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._batches_seen += 1
        super().on_train_batch_end(batch, logs)

    def _epoch_cut_short(self, logs: dict | None) -> str | None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            return f"its loss is {loss}"
        steps = (self.params or {}).get("steps")
        seen = getattr(self, "_batches_seen", None)
        if steps and seen is not None and seen < steps:
            return f"it ran {seen} of its {steps} batches"
        return None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._chief = None
        if self._is_chief() and not self._remote:
            self._prepare_directory(static_dir(self.filepath))
        if self.resume:
            self._restore()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._resumed_epoch is not None:
            # The starting epoch belongs to this run; a later `fit` starts
            # where its own `initial_epoch` says.
            _keras_compat.set_initial_epoch(self.model, None)
            self._resumed_epoch = None

    def _prepare_directory(self, directory: str) -> None:
        """Creates `directory`, checks it is writable, removes stale temp files."""
        try:
            os.makedirs(directory, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
            os.close(fd)
            os.remove(probe)
        except OSError as error:
            raise OSError(
                "ChiefCheckpoint cannot write to the checkpoint directory "
                f"{directory!r} ({error}). Received: filepath={self.filepath}"
            ) from error
        remove_leftovers(directory)

    def _restore(self) -> None:
        path = latest_checkpoint(self.filepath)
        if path is None:
            return
        model = self.model
        if not model.built:
            raise ValueError(
                "`resume=True` needs a built model, to load the checkpoint into. "
                f"Received: unbuilt model {model.name!r}"
            )
        if model.optimizer is not None:
            _keras_compat.build_optimizer(model.optimizer, model.trainable_variables)
        model.load_weights(path)
        self._resumed_epoch = checkpoint_epoch(path, self.filepath)
        _keras_compat.set_initial_epoch(model, self._resumed_epoch)
        if self.verbose > 0:
            _keras_compat.print_msg(
                f"Resuming from {path}: training starts at epoch "
                f"{self._resumed_epoch + 1}"
            )

    def save_checkpoint(self, epoch: int, batch: int | None, logs: dict | None) -> None:
        """Saves this epoch's (or batch's) checkpoint on the chief only."""
        if batch is None:
            reason = self._epoch_cut_short(logs)
            if reason is not None:
                warnings.warn(
                    f"ChiefCheckpoint: epoch {epoch + 1} is not saved because "
                    f"{reason}.",
                    stacklevel=2,
                )
                return
        filepath = self.checkpoint_path(epoch, batch, logs)
        if not self.should_save(epoch, batch, logs, filepath):
            return
        if not self._is_chief():
            self._save_and_discard(filepath)
        elif self._remote:
            self._save_to(filepath)
        else:
            self._save_atomically(filepath)
        if self.verbose > 0 and self._is_chief():
            _keras_compat.print_msg(
                f"\nEpoch {epoch + 1}: finished saving model to {filepath}"
            )

    def _save_to(self, path: str) -> None:
        if self.save_weights_only:
            self.model.save_weights(path, overwrite=True)
        else:
            self.model.save(path, overwrite=True)

    def _save_atomically(self, filepath: str) -> None:
        if os.path.isdir(filepath):
            raise IsADirectoryError(
                "Please specify a non-directory filepath for ChiefCheckpoint. "
                f"Filepath used is an existing directory: {filepath}"
            )
        directory = os.path.dirname(filepath) or os.curdir
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise write_error("create the directory of", filepath, error) from error
        try:
            write_atomically(filepath, self._save_to)
        except OSError as error:
            raise write_error("write the checkpoint", filepath, error) from error
        fsync(directory, directory=True)

    def _save_and_discard(self, filepath: str) -> None:
        try:
            worker = str(cluster.worker_index())
        except ValueError:
            worker = "x"
        temp_dir = tempfile.mkdtemp(prefix=f"kerastower-worker{worker}-")
        try:
            self._save_to(os.path.join(temp_dir, os.path.basename(filepath)))
        except OSError as error:
            raise write_error(
                f"save into the temporary directory of non-chief worker {worker}, for",
                filepath,
                error,
            ) from error
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
