"""`keras.callbacks.ModelCheckpoint`'s private save hook, in either family.

Both Keras families save in ``ModelCheckpoint._save_model(epoch, batch,
logs)`` and name the file in ``_get_file_path(epoch, batch, logs)``;
each family's ``CheckpointHooks`` adds how it decides whether to save.
"""

from __future__ import annotations


class CheckpointRouting:
    """Routes ``ModelCheckpoint._save_model`` to ``save_checkpoint(epoch,
    batch, logs)`` and exposes the file name Keras would save to."""

    def _save_model(self, epoch, batch, logs):
        self.save_checkpoint(epoch, batch, logs)

    def checkpoint_path(self, epoch: int, batch: int | None, logs) -> str:
        """The file the checkpoint of this epoch (and batch) goes to."""
        return self._get_file_path(epoch, batch, logs)
