"""How one training, evaluation or prediction step runs on towers.

A step, top to bottom (`TowerStep.train`):

1. The global batch of ``B`` examples is cut into contiguous shards, one per
   tower (`kerastower.step.shards`); a batch smaller than the number of towers
   runs whole on the first tower instead (`kerastower.step.tower_runs`).
2. Each tower runs the forward pass and its loss on its shard, weighted so
   that the towers add up to the one-device loss
   (`kerastower.step.loss_weighting`), with `BatchNormalization` statistics
   of the global batch (`kerastower.step.batch_norm`), and takes its
   gradients: one function traced once and called on every tower's device
   (`kerastower.step.traced_towers`), or, with XLA or several workers, one
   copy per tower inside
   `tf.distribute.Strategy.run`.
3. The towers' gradients are summed into the one-device gradient
   (`kerastower.reduce.gradients.sum_gradients`), summed over workers when there are
   several, and applied once by the model's own optimizer (or accumulated by
   `kerastower.callbacks.GradientAccumulation`).
4. The loss tracker and compiled metrics are updated once, on the whole
   batch's predictions.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.reduce import replica_setting, workers
from kerastower.reduce.gradients import EagerStaticRows, traced_static_rows
from kerastower.step import checks, coupled_loss, layer_updates, tower_body
from kerastower.step.plan import ONE_DEVICE, StepPlan
from kerastower.step.shards import first_leaf, with_masks
from kerastower.step.step_loss import StepLoss
from kerastower.step.tower_runs import TowerRuns


class StepGradients(NamedTuple):
    """What `TowerStep.split_gradients` returns.

    Attributes:
        gradients: Per variable, the one-device gradient of the batch (summed
            over this worker's towers), or ``None`` where it has none.
        loss: The batch's loss, as one device computes it.
        outputs: The per-example outputs of `loss_fn`, in batch order.
        total: ``B``, the global batch size (every worker's), as float32.
        static_rows: The indices of the variables whose sparse gradients
            gather a fixed set of rows (for the sum over the workers that
            follows, `kerastower.reduce.workers.sum_gradients_over_workers`).
    """

    gradients: list
    loss: Any
    outputs: Any
    total: Any
    static_rows: set[int]


class TowerStep:
    """Runs the steps of one `TowerModel` on its towers.

    Args:
        model: The `kerastower.TowerModel`.
        replicas: The `kerastower.reduce.replicas.Replicas` the towers read
            and update, or ``None`` for towers reading the model's variables.

    Attributes:
        replicas: As given.
        accumulator: The `kerastower.reduce.accumulation.GradientWindow`
            that training steps add their gradients to instead of applying
            them, or ``None`` (set through
            `TowerModel.gradient_accumulator`).
    """

    def __init__(self, model, replicas=None):
        self.model = model
        self.replicas = replicas
        self.accumulator = None
        self.eager_static_rows = EagerStaticRows()
        self.loss = StepLoss(model)
        self.runs = TowerRuns(model, self.loss)
        self.coupled = coupled_loss.CoupledLossCheck(model)

    # -- one step ---------------------------------------------------------

    def plan(self, across_workers: bool = True) -> StepPlan:
        """The `StepPlan` of the step being traced now (`across_workers`:
        ``False`` for prediction)."""
        return StepPlan.of(self.model, self.replicas, self.accumulator, across_workers)

    def train(self, data, plan: StepPlan) -> dict:
        """One training step on the global batch `data`, run as `plan` says;
        returns the logs."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        _keras_compat.build_before_towers(model, x)
        trainable = model.trainable_weights
        batch_size = tf.shape(first_leaf(x))[0]
        accumulator = plan.accumulator
        static_rows: set[int] = set()

        loss_fn = tower_body.model_loss(model, self.loss)
        if plan.towers == ONE_DEVICE:
            with tf.device(model.tower_devices[0]):
                gradients, loss, y_pred = self.one_device_gradients(
                    x, y, sample_weight, trainable
                )
            global_batch_size = batch_size
            if accumulator is not None and any(
                isinstance(g, tf.IndexedSlices) for g in gradients
            ):
                # Which sparse gradients gather a fixed set of rows.
                data = (x, y, sample_weight)
                traced = self.eager_static_rows(loss_fn, trainable, data)
                static_rows = (
                    traced_static_rows(loss_fn, trainable, data)
                    if traced is None
                    else traced
                )
        else:
            checks.check_no_overwritten_gradients(model, trainable)
            replicas = plan.replicas
            if replicas is not None:
                replicas.ensure(trainable, model.optimizer)
                if accumulator is not None:
                    accumulator.attach(replicas)
            gradients, loss, y_pred, global_batch_size, static_rows = (
                self.split_gradients(
                    loss_fn,
                    trainable,
                    (x, y, sample_weight),
                    plan,
                    scale_loss=_keras_compat.loss_scaler(model.optimizer),
                )
            )
            if replicas is None:
                loss, gradients = workers.sum_gradients_over_workers(
                    model, loss, gradients, static_rows
                )
            else:  # the replicas' ring spans every worker's towers
                loss = workers.sum_over_workers(model, loss)
        if not trainable:
            warnings.warn(
                "The model does not have any trainable weights.", stacklevel=2
            )
        else:
            # The first step's check of the loss comes before any update.
            gradients = coupled_loss.after(
                self.coupled.check(y, y_pred, batch_size), gradients
            )
            if accumulator is not None:
                # Micro-batches weigh by their examples on all workers together.
                accumulator.accumulate(
                    gradients, global_batch_size, model.optimizer, static_rows
                )
            elif plan.replicas is not None:  # the update the replicas traced
                plan.replicas.apply_first(gradients)
            else:
                model.optimizer.apply_gradients(zip(gradients, trainable))

        with workers.MetricsOverWorkers(model) as over:
            # Keras 2's compiled loss updates ``loss`` itself (`StepLoss`).
            _keras_compat.track_step_loss(model, loss, batch_size)
            logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return over.logs(logs)

    def test(self, data, plan: StepPlan) -> dict:
        """One evaluation step on the global batch `data`, run as `plan`
        says; returns the logs."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        _keras_compat.build_before_towers(model, x)
        variables, replicas = replica_setting.inference_reads(
            self.replicas, model.trainable_weights
        )
        with layer_updates.step_state(model, training=False) as state:
            body = tower_body.Evaluation(model, state, variables, replicas, self.loss)
            (loss, y_pred, per_output, masks), _ = self.runs.split_run(
                body, (x, y, sample_weight), plan
            )
        y_pred = with_masks(y_pred, masks)
        loss = workers.sum_over_workers(self.model, loss)
        self.loss.update_metrics(per_output, y_pred)

        with workers.MetricsOverWorkers(model) as over:
            batch_size = tf.shape(first_leaf(x))[0]
            _keras_compat.track_step_loss(model, loss, batch_size)
            logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return over.logs(logs)

    def predict(self, data, plan: StepPlan):
        """Predictions for the global batch `data`, in input order, run as
        `plan` says."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        _keras_compat.build_before_towers(self.model, x)
        variables, replicas = replica_setting.inference_reads(
            self.replicas, self.model.trainable_weights
        )
        with layer_updates.step_state(self.model, training=False) as state:
            body = tower_body.Prediction(self.model, state, variables, replicas)
            y_pred, _ = self.runs.split_run(body, x, plan)
        return y_pred

    # -- gradients ----------------------------------------------------------

    def one_device_gradients(self, x, y, sample_weight, trainable):
        """Keras's own step on one device (for gradient accumulation)."""
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = _keras_compat.forward(model, x, training=True)
            loss = _keras_compat.compute_loss(
                model, x, y, y_pred, sample_weight, training=True
            )
            scaled = _keras_compat.loss_scaler(model.optimizer)(loss)
        return tape.gradient(scaled, trainable), loss, y_pred

    def split_gradients(
        self,
        loss_fn,
        variables,
        data,
        plan: StepPlan,
        scale_loss=None,
        update_replicas=True,
    ) -> StepGradients:
        """The one-device gradients and loss of `data`, from the towers.

        ``loss_fn(shard)`` returns ``(loss, outputs)``: the shard's loss as
        one device computes it (weighted by `loss_weighting.weigh_loss`) and
        per-example outputs. The towers run as `plan` says. With its
        ``replicas`` (a `kerastower.reduce.replicas.Replicas` of
        `variables`), each tower reads its replicas, and the replicas are
        updated with the all-reduced gradients, or add them to their windows
        of its ``accumulator`` (a `GradientWindow` attached to the
        replicas), or, without `update_replicas`, left as they are; the
        gradients returned are then tower 0's.

        Returns:
            A `StepGradients`, summed or concatenated over this worker's
            towers.
        """
        replicas = plan.replicas
        checks.check_no_overwritten_gradients(self.model, variables)
        eager_rows = self.eager_static_rows(loss_fn, variables, data)
        with layer_updates.step_state(self.model, replicas) as state:
            body = tower_body.Gradients(
                self.model,
                state,
                variables,
                replicas,
                self.loss,
                loss_fn,
                scale_loss,
                eager_rows,
            )
            (grads, loss, outputs, per_output, masks), total = self.runs.split_run(
                body, data, plan
            )
        connected, static_rows = body.connected, body.static_rows
        if replicas is not None:
            static = [static_rows[j] for j in connected]
            if update_replicas:  # `total`: every worker's examples
                grads = replicas.update(
                    grads,
                    connected,
                    static,
                    plan.accumulator,
                    total,
                    body.summed_inside,
                )
            else:
                grads = replicas.reduce(
                    grads,
                    [variables[j] for j in connected],
                    static,
                    body.summed_inside,
                )[0]
        outputs = with_masks(outputs, masks)
        self.loss.update_metrics(
            per_output, outputs if tf.nest.flatten(outputs) else data
        )
        gradients = [None] * len(variables)
        for k, j in enumerate(connected):
            gradients[j] = grads[k]
        static = {j for j, rows in static_rows.items() if rows}
        return StepGradients(gradients, loss, outputs, total, static)
