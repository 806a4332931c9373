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

`TowerFrame` opens that context for the towers of one step and calls a
tower's body (`kerastower.step.tower_body`) inside it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.reduce import workers
from kerastower.reduce.towers import TowerSum
from kerastower.step.batch_norm import global_moments
from kerastower.step.loss_weighting import TowerLoss, TowerLosses
from kerastower.workers import multi_worker


class _IgnoredMetric:
    """Stands in for Keras's per-output loss metrics inside the towers.

    They are updated once, with the global values, after the towers ran.
    """

    def update_state(self, value, sample_weight=None):
        del value, sample_weight


@contextlib.contextmanager
def tower_context(
    model: keras.Model,
    global_batch: Any,
    sum_fn: Any,
    sync_batch_norm: bool,
    gather: Any = None,
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
        gather: Stacks tensors of every tower, where the towers can
            (`kerastower.reduce.towers.TowerCollectives.gather`), or ``None``.

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
                moments = functools.partial(
                    global_moments, total=sum_fn.total, gather=gather
                )
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


class TowerFrame:
    """What every tower of one step runs inside, and the call of its body.

    Args:
        model: The `kerastower.TowerModel`.
        loss: Its `kerastower.step.step_loss.StepLoss`.
        total: ``B``, the step's examples on all its workers, float32.
        offset: The examples of the workers before this one, int32.
        num_workers: The workers whose towers make the step.
        block: The `kerastower.reduce.keys.StepBlock` that numbers the sums
            over workers, or ``None`` on one worker.
    """

    def __init__(self, model, loss, total, offset, num_workers: int, block=None):
        self.model = model
        self.loss = loss
        self.total = total
        self.offset = offset
        self.num_workers = num_workers
        self.block = block

    def new_sum(self) -> TowerSum:
        """A sum over every tower of every worker."""
        return TowerSum(
            self.num_workers,
            self.model.tower_devices[0],
            multi_worker.timeout(),
            self.block,
        )

    @contextlib.contextmanager
    def towers(self, sizes, gather=None) -> Iterator[TowerLosses]:
        """The context of towers holding `sizes` examples each (int32,
        ``(N,)``): the global batch's statistics and, with
        ``global_batch_loss``, its loss; `gather` stacks tensors of every
        tower where the towers can (`tower_context`)."""
        sum_fn = self.new_sum()
        with (
            self.loss.gathering(sizes, sum_fn, self.offset, self.total),
            tower_context(self.model, self.total, sum_fn, True, gather) as losses,
        ):
            yield losses

    @contextlib.contextmanager
    def one_tower(self, batch) -> Iterator[TowerLosses]:
        """The context of the first tower holding this worker's whole batch
        of `batch` examples: one device's statistics, unless other workers
        add theirs."""
        sum_fn = self.new_sum()
        several = self.num_workers > 1
        # On several workers the loss of the whole batch needs every
        # worker's rows; on one, this tower holds them all.
        gathering = (
            self.loss.gathering(tf.reshape(batch, [1]), sum_fn, self.offset, self.total)
            if several
            else contextlib.nullcontext()
        )
        with (
            gathering,
            tower_context(self.model, self.total, sum_fn, several) as losses,
        ):
            yield losses

    def call(self, body, shard, weight, losses, given_values=None) -> Any:
        """``body(shard, weight, losses, given_values)``, where a `Mean` of
        a batch scalar (a loss tracked in `compute_loss`) counts the tower
        with its weight, so that the towers count the batch once."""
        with _keras_compat.scalar_means_weighted(weight, self.model):
            return body(shard, weight, losses, given_values)
