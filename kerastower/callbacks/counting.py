"""Counting the examples a model has trained on, from its ``loss`` metric."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def loss_count(model: Any) -> int | None:
    """Examples the model's ``loss`` metric has counted since its last reset.

    Keras weighs each step's update of that metric by the batch's examples
    (all towers and workers together under `kerastower.TowerModel`), so its
    count is the examples of the epoch so far. ``None`` when the model has
    no such metric (a custom `train_step` that does not update it).
    """
    metric = next((m for m in model.metrics if m.name == "loss"), None)
    count = getattr(metric, "count", None)
    if count is None:
        return None
    return round(float(tf.convert_to_tensor(count).numpy()))
