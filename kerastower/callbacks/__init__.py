"""Keras callbacks for tower training."""

from kerastower import _installed_keras

_installed_keras.check_tensorflow_backend(
    "kerastower.callbacks",
    "On JAX, one process trains: Keras's own keras.callbacks.ModelCheckpoint, "
    "BackupAndRestore and TensorBoard do what ChiefCheckpoint, "
    "BackupAndRestore and TowerMonitor do for several workers; "
    "GradientAccumulation and BatchScaling have no JAX version yet.",
)

from kerastower.callbacks.backup_and_restore import BackupAndRestore
from kerastower.callbacks.batch_scaling import BatchScaling, ScaledSchedule
from kerastower.callbacks.chief_checkpoint import (
    ChiefCheckpoint,
    checkpoint_epoch,
    latest_checkpoint,
)
from kerastower.callbacks.gradient_accumulation import GradientAccumulation
from kerastower.callbacks.tower_monitor import TowerMonitor

__all__: list[str] = [
    "BackupAndRestore",
    "BatchScaling",
    "ChiefCheckpoint",
    "GradientAccumulation",
    "ScaledSchedule",
    "TowerMonitor",
    "checkpoint_epoch",
    "latest_checkpoint",
]
