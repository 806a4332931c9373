"""Keras callbacks for tower training."""

from kerastower.callbacks.batch_scaling import BatchScaling, ScaledSchedule

__all__: list[str] = [
    "BatchScaling",
    "ScaledSchedule",
]
