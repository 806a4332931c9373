"""Keras callbacks for tower training."""

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
