"""What one tower computes on its shard, and how the towers' results join.

A step hands one of these bodies to `kerastower.step.tower_runs.TowerRuns`,
which calls it on every tower's shard (``body(shard, weight, losses)``) and
joins the towers' results with ``body.combine(per_tower)``:

- `Gradients` (training, and `TowerModel.tower_gradients`): the tower's
  weighted loss ``(n_i / B) L_i`` and its gradients; joined, the one-device
  loss and gradient ``sum_i (n_i / B) dL_i/dw`` (sparse ones gathered as one
  device has them, `kerastower.reduce.gradients.sum_gradients`);
- `Evaluation`: the weighted loss and the predictions; joined, the
  one-device loss and the predictions in batch order;
- `Prediction`: the predictions; joined in batch order.

Every tower reads the weights as the step found them
(`kerastower.step.layer_updates.tower_reads`); a tower traced once hands
back what it assigned (`traced_updates`) and the step makes those
assignments after the calls (`apply_updates`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.reduce.gradients import has_static_rows, sum_gradients
from kerastower.step import layer_updates
from kerastower.step.shards import concat_nest, masks_of


def model_loss(model, loss) -> Callable:
    """The ``loss_fn`` of a `Gradients` body for the model's own loss.

    ``loss_fn((x, y, sample_weight))`` runs the model's forward pass in
    training mode and returns ``(loss, y_pred)``, the loss as `loss` (the
    step's `kerastower.step.step_loss.StepLoss`) computes it.
    """

    def loss_fn(shard):
        x, y, sample_weight = shard
        y_pred = _keras_compat.forward(model, x, training=True)
        return loss.compute(x, y, y_pred, sample_weight, training=True), y_pred

    return loss_fn


class TowerBody:
    """One tower's part of a step; subclasses say what it computes.

    Args:
        model: The `kerastower.TowerModel`.
        state: The step's `kerastower.step.layer_updates.StepState`.
        variables: The variables a tower reads (and differentiates).
        replicas: The `kerastower.reduce.replicas.Replicas` a tower after
            the first reads, or ``None`` for the model's variables.
    """

    def __init__(self, model, state, variables: Sequence[Any], replicas=None):
        self.model = model
        self.state = state
        self.variables = list(variables)
        self.replicas = replicas

    def __call__(self, shard, weight, losses, given_values=None):
        """The tower's result on `shard`, of weight ``n_i / B`` (float64).

        `losses` are the `kerastower.step.loss_weighting.TowerLosses` of
        the tower's context; `given_values` maps the ``id`` of a variable
        to the calling tower's value of it (its replica's, with replicas),
        where a tower traced once takes them as inputs (see
        `layer_updates.tower_reads`).
        """
        raise NotImplementedError

    def combine(self, per_tower: list) -> Any:
        """The step's result from the towers' results, in tower order."""
        raise NotImplementedError

    def reads(self, given_values=None):
        """The tower's reads of the weights (a context yielding the values
        to differentiate; see `layer_updates.tower_reads`)."""
        return layer_updates.tower_reads(
            self.model,
            self.variables,
            self.state,
            self.replicas,
            given_values=given_values,
        )

    def traced_updates(self) -> list:
        """What the tower traced once assigned, as it left it."""
        return layer_updates.traced_values(self.state)

    def apply_updates(self, per_tower: Sequence, first_tower: int = 0) -> None:
        """Makes the traced tower's assignments, tower by tower, from
        `first_tower` on."""
        layer_updates.apply_traced(self.model, self.state, per_tower, first_tower)


class Prediction(TowerBody):
    """The model's outputs; joined in batch order."""

    def __call__(self, shard, weight, losses, given_values=None):
        with self.reads(given_values):
            return _keras_compat.forward(self.model, shard, training=False)

    def combine(self, per_tower: list) -> Any:
        return concat_nest(per_tower)


class Evaluation(TowerBody):
    """The tower's weighted loss and outputs on ``(x, y, sample_weight)``.

    Args:
        loss: The step's `kerastower.step.step_loss.StepLoss`.
        (and those of `TowerBody`)
    """

    def __init__(self, model, state, variables, replicas, loss):
        super().__init__(model, state, variables, replicas)
        self.loss = loss

    def __call__(self, shard, weight, losses, given_values=None):
        x, y, sample_weight = shard
        with self.reads(given_values):
            y_pred = _keras_compat.forward(self.model, x, training=False)
            loss, per_output = self.loss.tower_loss(
                x, y, y_pred, sample_weight, weight, losses, training=False
            )
        return (), loss, y_pred, per_output, masks_of(y_pred)

    def combine(self, per_tower: list) -> Any:
        """``(loss, y_pred, per_output, masks)`` of the batch."""
        return self.loss.combine(per_tower)


class Gradients(TowerBody):
    """The tower's gradients of its weighted loss.

    ``loss_fn(shard)`` returns ``(loss, outputs)``: the shard's loss as one
    device computes it and per-example outputs. A tower differentiates
    ``(n_i / B) loss`` (scaled by `scale_loss`, a loss-scale optimizer's);
    `combine` sums the towers' gradients into the one-device gradient, or,
    with replicas, keeps each tower's for the all-reduce that follows.

    Args:
        loss: The step's `kerastower.step.step_loss.StepLoss`.
        loss_fn: As above.
        scale_loss: ``None``, or the function that scales the loss.
        eager_rows: Which sparse gradients gather a fixed set of rows, as
            read from a step run eagerly (`EagerStaticRows`), or ``None``
            to read it from the traced gradients.
        (and those of `TowerBody`)

    Attributes:
        connected: The indices of the `variables` with a gradient, once a
            tower has traced.
        static_rows: Per connected index, whether its gradient gathers a
            fixed set of rows in every way the batch ran, once combined.
        summed_inside: Whether each tower summed its dense gradients over
            the towers itself, with replicas, inside the tower traced once
            (`kerastower.step.traced_towers`): the step then all-reduces
            the sparse ones only.
    """

    def __init__(
        self,
        model,
        state,
        variables,
        replicas,
        loss,
        loss_fn: Callable,
        scale_loss: Callable | None = None,
        eager_rows: set[int] | None = None,
    ):
        super().__init__(model, state, variables, replicas)
        self.loss = loss
        self.loss_fn = loss_fn
        self.scale_loss = scale_loss
        self.eager_rows = eager_rows
        self.connected: list[int] = []
        self.static_rows: dict[int, bool] = {}
        self.summed_inside = False
        self._rows_inside: dict[int, bool] = {}

    def __call__(self, shard, weight, losses, given_values=None):
        with tf.GradientTape() as tape:
            with self.reads(given_values) as read:
                # A tower traced once reads its replicas as inputs.
                tape.watch([r for r in read if isinstance(r, tf.Tensor)])
                loss, outputs = self.loss_fn(shard)
                loss, per_output = self.loss.weigh(loss, weight, losses)
                scaled = loss if self.scale_loss is None else self.scale_loss(loss)
        grads = tape.gradient(scaled, read)
        self.connected[:] = [j for j, g in enumerate(grads) if g is not None]
        for j in self.connected:  # inside the tower: a traced call hides it
            self._rows_inside[j] = self._rows_inside.get(j, True) and has_static_rows(
                [grads[j]]
            )
        return (
            [grads[j] for j in self.connected],
            loss,
            outputs,
            per_output,
            masks_of(outputs),
        )

    def combine(self, per_tower: list) -> Any:
        """``(gradients, loss, outputs, per_output, masks)`` of the batch:
        the gradients summed, or with replicas one list per tower."""
        loss, outputs, per_output, masks = self.combine_rest(per_tower)
        grads = self.combine_gradients([t[0] for t in per_tower])
        return grads, loss, outputs, per_output, masks

    def combine_gradients(
        self, per_tower: list, first_alone: tf.Tensor | None = None
    ) -> list:
        """The towers' gradients (a list per tower, or one where the first
        tower ran the batch whole) as the step applies them, once
        `combine_rest` has run: summed (`summed`), or with replicas one
        list per tower, all-reduced once after every way of running the
        batch (`Replicas.every_tower`), summed already where the towers
        did (`summed_inside`)."""
        if self.replicas is None:
            return self.summed(per_tower, first_alone)
        return self.replicas.every_tower(per_tower)

    def summed(self, per_tower: list, first_alone: tf.Tensor | None = None) -> list:
        """The towers' gradients (a list per tower) summed into the
        one-device gradients, once `combine_rest` has run; where
        `first_alone` (a bool scalar), the first tower's, which ran the
        whole batch while the others ran it too and add nothing."""
        static = [self.static_rows[j] for j in self.connected]
        return [
            sum_gradients(g, rows, first_alone)
            for g, rows in zip(zip(*per_tower), static)
        ]

    def combine_rest(self, per_tower: list) -> Any:
        """``(loss, outputs, per_output, masks)`` of the batch, for towers
        whose gradients are combined apart (`summed_inside`)."""
        for j in self.connected:  # both ways of running the batch must agree
            rows = (
                self._rows_inside[j]
                if self.eager_rows is None
                else j in self.eager_rows
            )
            self.static_rows[j] = self.static_rows.get(j, True) and rows
        return self.loss.combine(per_tower)
