"""What the towers of one step trace under: weighted losses, global statistics.

While the towers trace their forward pass and loss:

- each of Keras's compiled losses is wrapped in
  `kerastower.step.loss_weighting.TowerLoss`, which records every tower's values,
  so that the towers weigh their losses to add up to one device's loss;
- Keras's per-output loss metrics ignore updates: the step updates them once,
  with the values of the global batch;
- with synchronised statistics, every `BatchNormalization` layer normalises
  with the mean and variance of the global batch, summed over the towers
  (`kerastower.step.batch_norm.global_moments`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.reduce import workers
from kerastower.step.batch_norm import global_moments
from kerastower.step.loss_weighting import TowerLoss, TowerLosses


class _IgnoredMetric:
    """Stands in for Keras's per-output loss metrics inside the towers.

    They are updated once, with the global values, after the towers ran.
    """

    def update_state(self, value, sample_weight=None):
        del value, sample_weight


@contextlib.contextmanager
def tower_context(
    model: keras.Model, global_batch: Any, sum_fn: Any, sync_batch_norm: bool
) -> Iterator[TowerLosses]:
    """Weights compiled losses per tower while the towers trace.

    Args:
        model: The `kerastower.TowerModel`.
        global_batch: ``B``, the number of examples of the step's global
            batch (all workers'), a float32 scalar.
        sum_fn: A `kerastower.reduce.towers.TowerSum`: sums over every tower of
            every worker.
        sync_batch_norm: Whether `BatchNormalization` layers use the
            statistics of all towers (only if the model's ``sync_batch_norm``
            is set too).

    Yields:
        The `kerastower.step.loss_weighting.TowerLosses` the towers weight their
        loss by.
    """
    patched = []
    synchronised = sync_batch_norm and model.sync_batch_norm
    for layer in _keras_compat.inner_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            moments = None  # the layer's own, of this tower's shard
            if synchronised:
                moments = functools.partial(global_moments, total=sum_fn.total)
            _keras_compat.override_batch_norm_moments(layer, moments)
            patched.append(layer)
    records: dict = {}
    layers = _keras_compat.inner_layers(model)
    try:
        with (
            _keras_compat.activity_penalties_summed(layers, global_batch),
            _keras_compat.compiled_losses_replaced(
                model, lambda loss: TowerLoss(loss, records), _IgnoredMetric
            ) as (loss_weights, has_metrics, container_totals),
        ):
            yield TowerLosses(
                records,
                loss_weights,
                global_batch,
                has_metrics,
                sum_fn,
                workers.worker_rank(model) == 0,
                container_totals,
            )
    finally:
        for layer in patched:
            _keras_compat.restore_batch_norm(layer)
