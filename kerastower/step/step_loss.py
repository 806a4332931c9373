"""A step's loss on towers: of each shard, or of the whole batch.

`StepLoss` computes a tower's loss and weighs it
(`kerastower.step.loss_weighting`), adds up the towers' losses and updates
Keras's per-output loss metrics once, with the global values.

**The loss of the whole batch** (``global_batch_loss``).

Some losses compare the examples of a batch with each other: contrastive
losses with in-batch negatives, `keras.losses.Circle`, `Dice` and `Tversky`
over the whole batch. Their value on a batch is not a combination of their
values on its shards, so the towers' weighted losses
(`kerastower.step.loss_weighting`) cannot add up to it.

With ``TowerModel(..., global_batch_loss=True)`` each tower runs the forward
pass on its shard as usual, then gathers every tower's predictions, targets
and sample weights (and inputs, for a `compute_loss` of the model's own)
into the global batch, in input order
(`kerastower.reduce.towers.gather_over_towers`), and computes the model's
loss on it: every tower computes the one-device loss ``L``. The first tower
counts it once, the others with weight 0, so the towers' losses add up to
``L``; the gradient of ``L`` with respect to tower ``i``'s predictions
reaches tower ``i`` through the gather's gradient, and the towers' parameter
gradients add up to one device's.

Losses added in the forward pass (``add_loss``, activity regularizers,
weight regularizers) stay each tower's, read before the gather, and are
weighted by the tower's share ``n_i / B`` as without the option
(`kerastower.step.loss_weighting`), so they add up to one device's.
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
from kerastower.reduce.towers import gather_over_towers
from kerastower.step import checks
from kerastower.step.loss_weighting import weigh_loss
from kerastower.step.shards import (
    concat_nest,
    first_leaf,
    gather_nest,
    masks_of,
    with_masks,
)


class StepLoss:
    """The loss of one `TowerModel`'s steps, tower by tower.

    Args:
        model: The `kerastower.TowerModel`.
    """

    def __init__(self, model: keras.Model):
        self.model = model
        self._gather = None
        self._towers: set = set()

    @contextlib.contextmanager
    def gathering(
        self,
        sizes: tf.Tensor,
        sum_fn: Any,
        offset: tf.Tensor | int = 0,
        total: tf.Tensor | None = None,
    ) -> Iterator[None]:
        """Makes the towers run while open compute the global batch's loss,
        with ``global_batch_loss`` (else does nothing).

        Args:
            sizes: This worker's towers' numbers of examples.
            sum_fn: Sums a list of tensors over every tower of every worker.
            offset: The examples of the workers before this one.
            total: ``B``, the examples of all workers (default: this one's).
        """
        if self.model.global_batch_loss:
            self._gather = functools.partial(
                gather_over_towers,
                sizes=sizes,
                sum_fn=sum_fn,
                offset=offset,
                total=total,
            )
        try:
            yield
        finally:
            self._gather = None

    def compute(self, x, y, y_pred, sample_weight, training):
        """The model's `compute_loss`: of the global batch while `gathering`,
        else of this shard."""
        model, gather = self.model, self._gather
        checks.check_no_coupled_loss(model)
        if gather is None:
            return _keras_compat.compute_loss(
                model, x, y, y_pred, sample_weight, training=training
            )
        # The gather waits for every tower, whose forward passes may then
        # replace the layers' losses: this tower's are read before it.
        own = _additional_loss(model)
        if type(model).compute_loss is not keras.Model.compute_loss:
            x = gather_nest(x, gather)
        y, y_pred, sample_weight = gather_nest((y, y_pred, sample_weight), gather)
        self._towers.add(tf.distribute.get_replica_context())
        loss = _keras_compat.compute_loss(
            model, x, y, y_pred, sample_weight, training=training
        )
        seen = _additional_loss(model)  # what `compute_loss` just added
        return loss - tf.cast(seen, loss.dtype) + tf.cast(own, loss.dtype)

    def weigh(self, loss, weight, losses):
        """`weigh_loss` of the tower's last `compute`d (or given) loss."""
        context = tf.distribute.get_replica_context()
        whole = context in self._towers
        self._towers.discard(context)
        weighted, per_output = weigh_loss(loss, weight, losses, whole_batch=whole)

        def factor():
            # What the loss was multiplied by; the share for a loss of 0.
            finite = tf.math.is_finite(loss) & tf.not_equal(loss, 0)
            share = tf.cast(weight, weighted.dtype)
            return tf.where(finite, tf.math.divide_no_nan(weighted, loss), share)

        # A `Mean` of the loss updated in `compute_loss` weighs as the loss.
        _keras_compat.weigh_scalar_means(factor)
        if losses.container_totals is not None:
            per_output = [
                *per_output,
                self._container_share(loss, weighted, weight, losses),
            ]
        return weighted, per_output

    @staticmethod
    def _container_share(loss, weighted, weight, losses):
        """This tower's weighted share of Keras 2's ``loss`` metric.

        Keras 2's metric takes the compiled loss ``C_i`` (compiled losses
        and regularization), not what a `compute_loss` of the user's adds to
        it, ``loss - C_i``, which is weighted by the tower's share: the
        metric's share is ``weighted - (loss - C_i) * n_i / B``. 0 for a
        tower whose `compute_loss` did not call the compiled loss.
        """
        total = losses.container_totals.pop(tf.distribute.get_replica_context(), None)
        if total is None:
            return tf.zeros_like(weighted)
        added = loss - tf.cast(total, loss.dtype)
        return weighted - added * tf.cast(weight, loss.dtype)

    def tower_loss(self, x, y, y_pred, sample_weight, weight, losses, training):
        """This tower's weighted share of the step's loss and of each output's.

        See `kerastower.step.loss_weighting` for the rule.
        """
        loss = self.compute(x, y, y_pred, sample_weight, training)
        return self.weigh(loss, weight, losses)

    @staticmethod
    def combine(per_tower):
        """Adds up the towers' weighted losses and per-output losses."""
        loss = tf.add_n([t[1] for t in per_tower])
        per_output = [tf.add_n(list(v)) for v in zip(*[t[3] for t in per_tower])]
        y_pred = concat_nest([with_masks(t[2], t[4]) for t in per_tower])
        return loss, y_pred, per_output, masks_of(y_pred)

    def update_metrics(self, per_output, batch):
        """Updates Keras's per-output loss metrics once, with global values;
        on Keras 2 its ``loss`` metric too (the last value, see `weigh`)."""
        batch_dim = _keras_compat.loss_metric_weight(first_leaf(batch))
        metrics = _keras_compat.per_output_loss_metrics(self.model)
        if isinstance(batch_dim, tf.Tensor):
            # Keras 2 weighs by the batch one device sees: every worker's.
            batch_dim = tf.cast(batch_dim, keras.backend.floatx())
            values, batch_dim = workers.sum_over_workers(
                self.model, (per_output, batch_dim)
            )
        else:
            values = workers.sum_over_workers(self.model, per_output)
        values = _keras_compat.track_compiled_loss(self.model, values, batch_dim)
        # No `strict`: TensorFlow 2.12's autograph converts `zip` without it.
        for metric, value in zip(metrics, values):
            metric.update_state(value, sample_weight=batch_dim)


def _additional_loss(model: keras.Model) -> tf.Tensor:
    """The sum of `model.losses` (regularization, `add_loss`), as
    `keras.Model.compute_loss` adds it."""
    total = tf.constant(0.0, keras.backend.floatx())
    for loss in model.losses:
        if not loss.dtype.is_floating:
            loss = tf.cast(loss, keras.backend.floatx())
        total += tf.cast(tf.reduce_sum(loss), total.dtype)
    return total
