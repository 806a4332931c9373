"""How each tower's loss is weighted so that the towers add up to one device.

This module is the one place that holds the rule.

**Compiled losses.** For a compiled loss one device computes ``L = S / D``:
``S`` is the weighted sum of the per-element losses and ``D`` the divisor of
the loss's reduction (`kerastower._keras_compat.divisor`): the number of loss
elements, of unmasked elements when a Keras mask or ``ignore_class`` is
present, or the sum of sample weights for ``"mean_with_sample_weight"``.
Tower ``i`` computes ``L_i = S_i / D_i`` on its shard. Both ``S`` and ``D``
add up over shards, so

``L = sum_i S_i / sum_i D_i = sum_i (D_i / D) * L_i``.

A ``"sum"``-reduced loss is ``L = sum_i L_i``: every tower weighs 1. When
``D_i`` is ``n_i`` times a number that every shard shares (an unmasked
loss divides by ``n_i`` times the elements per example), ``D_i / D`` is
``n_i / B`` and nothing needs summing over the towers: only masked,
``ignore_class`` and sample-weight-summing divisors are.

**Everything else** in the model's loss (regularization, ``add_loss`` terms, a
custom ``compute_loss``) is taken to be a batch mean, and tower ``i`` weighs
its share of the examples, ``n_i / B`` (``B`` is the global batch, all towers
of all workers). Weight regularizers are identical on every tower, so they
are counted exactly once; a term that sums over the batch is not split
exactly, as under stock `MirroredStrategy`.

`TowerModel` multiplies each tower's whole loss by ``n_i / B``; a compiled
loss therefore returns ``L_i * t_i * B / n_i``, where ``t_i`` is its tower
weight above, so that the product is ``t_i * L_i``.

Across workers the same rule holds: ``D`` is summed over every tower of
every worker (`kerastower.reduce.towers`), so masked losses stay exact when the
workers hold different fractions of valid elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.reduce.towers import sum_over_towers


def compiled_loss_factor(
    divisor: tf.Tensor,
    total_divisor: tf.Tensor,
    examples: tf.Tensor,
    global_batch: tf.Tensor,
) -> tf.Tensor:
    """``(D_i / D) * (B / n_i)``: what a normalised tower loss is scaled by.

    Args:
        divisor: ``D_i``, this tower's divisor.
        total_divisor: ``D``, the sum of the divisors over all towers of all
            workers.
        examples: ``n_i``, this tower's examples.
        global_batch: ``B``, the examples of all towers of all workers.

    Returns:
        The factor; 0 where ``D`` or ``n_i`` is 0 (nothing to weigh).
    """
    d, total, n, b = (
        tf.cast(t, tf.float64) for t in (divisor, total_divisor, examples, global_batch)
    )
    # float64: exact counts past 2**24 elements, and a correctly rounded
    # factor once cast to the loss's dtype.
    return tf.math.divide_no_nan(d, total) * tf.math.divide_no_nan(b, n)


# What `TowerLoss` records as the divisor of a ``"sum"``-reduced loss, and of
# a batch mean (``D_i`` proportional to ``n_i``, see `weigh_compiled_losses`).
SUM = "sum"
BATCH_MEAN = "batch_mean"


class TowerLoss:
    """Stands in for one compiled loss while the towers trace, and records it.

    Calls the Keras loss unchanged and records, for the calling tower, its
    value and its divisor ``D_i``. `weigh_compiled_losses` turns the records
    into each loss's tower weight once the tower's loss is complete: summing
    the divisors over towers synchronises the towers, and a tower must have
    read the model's ``losses`` (which Keras keeps on the layers, shared by
    all towers) before another tower runs its forward pass.

    Args:
        loss: The Keras loss (a `keras.losses.Loss` or a loss callable).
        records: Where each tower's records go, keyed by its replica context.
    """

    def __init__(self, loss, records: dict):
        self.loss = loss
        self.reduction = getattr(loss, "reduction", "sum_over_batch_size")
        self.records = records

    def __call__(self, y_true, y_pred, sample_weight=None):
        value = self.loss(y_true, y_pred, sample_weight)
        examples = tf.cast(tf.shape(tf.nest.flatten(y_pred)[0])[0], tf.float32)
        if self.reduction == "sum":
            divisor = SUM
        else:
            divisor = _keras_compat.loss_divisor(
                self.loss, y_true, y_pred, sample_weight
            )
            if divisor is None:
                divisor = BATCH_MEAN
        context = tf.distribute.get_replica_context()
        self.records.setdefault(context, []).append((value, divisor, examples))
        return value


def weigh_compiled_losses(
    records,
    global_batch: tf.Tensor,
    sum_fn: Callable[[Sequence[tf.Tensor]], list[tf.Tensor]] = sum_over_towers,
) -> list[tf.Tensor | None]:
    """Each recorded compiled loss's factor ``t_i * B / n_i`` (see module).

    A batch mean (`BATCH_MEAN`: ``D_i`` is ``n_i`` times a number that is
    the same on every shard) has ``D_i / D = n_i / B``, so its factor is 1
    and ``None`` is returned for it; a `SUM` has ``B / n_i``. Only the other
    divisors (masked, ``ignore_class``, summed sample weights) depend on
    every tower's batch, and are summed over the towers, which waits for all
    towers' forward passes.

    Args:
        records: This tower's ``(value, divisor, examples)`` per compiled loss,
            in the order Keras computed them; ``divisor`` is `SUM`,
            `BATCH_MEAN` or a tensor ``D_i``.
        global_batch: ``B``, the examples of the step on all towers and
            workers, float32.
        sum_fn: Sums a list of tensors over every tower (of every worker:
            a `kerastower.reduce.towers.TowerSum`).

    Returns:
        One float64 factor per record, or ``None`` where it is 1. Every
        tower must call this once, with records of the same losses: it sums
        the divisors that need it over the towers.
    """
    if not records:
        return []
    examples = records[0][2]
    counted = [k for k, (_, d, _) in enumerate(records) if isinstance(d, tf.Tensor)]
    totals = {}
    if counted:
        (summed,) = sum_fn([tf.stack([records[k][1] for k in counted])])
        totals = {k: summed[i] for i, k in enumerate(counted)}
    factors = []
    for k, (_, divisor, _) in enumerate(records):
        if divisor is BATCH_MEAN:
            factors.append(None)
        elif divisor is SUM:
            b, n = tf.cast(global_batch, tf.float64), tf.cast(examples, tf.float64)
            factors.append(tf.math.divide_no_nan(b, n))
        else:
            factors.append(
                compiled_loss_factor(divisor, totals[k], examples, global_batch)
            )
    return factors


class TowerLosses(NamedTuple):
    """What a tower needs to weight its loss (see `kerastower.step.loss_weighting`).

    Attributes:
        records: Each tower's compiled-loss records, keyed by its replica
            context (filled by `TowerLoss`).
        loss_weights: The compiled losses' ``loss_weights``, in order.
        global_batch: ``B``, the step's examples on all towers and workers.
        per_output_metrics: Whether Keras keeps per-output loss metrics.
        sum_fn: Sums a list of tensors over all towers of all workers.
        first_worker: Whether this worker is the first (the chief), whose
            first tower counts a loss that every tower computed whole.
        container_totals: Keras 2: what each tower's compiled loss gave its
            ``loss`` metric (compiled losses and regularization, without what
            a `compute_loss` of the user's adds), keyed by its replica
            context; ``None`` on Keras 3, whose ``loss`` is the whole loss.
    """

    records: dict
    loss_weights: list
    global_batch: tf.Tensor
    per_output_metrics: bool
    sum_fn: Callable[[Sequence[tf.Tensor]], list[tf.Tensor]]
    first_worker: bool = True
    container_totals: dict | None = None


def weigh_loss(
    loss: tf.Tensor, weight: tf.Tensor, losses: TowerLosses, whole_batch=False
):
    """A tower's loss as one device computes it, weighted by its share.

    Called by every tower once its loss is complete (it sums the compiled
    losses' divisors over the towers).

    Args:
        loss: The tower's loss, as Keras computed it on the tower's shard.
        weight: ``n_i / B``, the tower's share of the global batch.
        losses: The step's `TowerLosses`.
        whole_batch: Whether every tower computed its compiled losses on the
            whole global batch (``global_batch_loss``): see
            `_weigh_whole_batch_loss`.

    Returns:
        The weighted loss and the weighted per-output losses (empty when
        Keras keeps no per-output loss metrics).
    """
    records = losses.records.pop(tf.distribute.get_replica_context(), [])
    if whole_batch:
        return _weigh_whole_batch_loss(loss, weight, records, losses)
    factors = weigh_compiled_losses(records, losses.global_batch, losses.sum_fn)
    per_output = []
    for (value, _, _), factor, loss_weight in zip(
        records, factors, losses.loss_weights
    ):
        value = tf.cast(value, loss.dtype)
        if factor is None:
            per_output.append(value)
            continue
        factor = tf.cast(factor, loss.dtype)
        # Keras added value * loss_weight; make it value * loss_weight *
        # factor. A non-finite value already makes the loss non-finite,
        # as on one device; correcting it would turn inf into NaN.
        correction = (factor - 1.0) * tf.cast(loss_weight, loss.dtype) * value
        finite = tf.math.is_finite(value)
        loss = loss + tf.where(finite, correction, tf.zeros_like(correction))
        per_output.append(value * factor)
    weight = tf.cast(weight, loss.dtype)
    if not losses.per_output_metrics:
        per_output = []
    return loss * weight, [v * weight for v in per_output]


def _weigh_whole_batch_loss(loss, weight, records, losses: TowerLosses):
    """`weigh_loss` for a tower whose compiled losses are the whole batch's.

    The compiled part ``C = sum_k value_k * loss_weight_k`` is the same on
    every tower of every worker: the first worker's first tower counts it
    once (weight 1), the others not at all; their gradients still reach
    every tower through the gather. The rest of Keras's loss, ``loss - C``
    (regularization and `add_loss` terms, computed on this tower's shard),
    is weighted by the tower's share
    ``n_i / B`` as without the option: a batch-mean activity penalty then
    adds up to the global batch's, a kernel penalty to one copy. When ``C``
    is not finite, the whole loss counts on the first tower, as on one
    device (the difference would be NaN).
    """
    first = tf.cast(
        tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
        & losses.first_worker,
        loss.dtype,
    )
    values = [tf.cast(value, loss.dtype) for value, _, _ in records]
    compiled = tf.zeros_like(loss)
    for value, loss_weight in zip(values, losses.loss_weights):
        compiled += value * tf.cast(loss_weight, loss.dtype)
    others = (loss - compiled) * tf.cast(weight, loss.dtype)
    weighted = tf.where(
        tf.math.is_finite(compiled), compiled * first + others, loss * first
    )
    per_output = [v * first for v in values] if losses.per_output_metrics else []
    return weighted, per_output
