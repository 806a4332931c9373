"""Gradients for a custom `train_step`, computed on the towers.

`TowerModel.tower_gradients` (documented there) checks its arguments here
and then runs one device's `tf.GradientTape` code, or the towers through
`TowerStep.split_gradients`, the routine of the built-in training step: the
same splitting, loss weighting and sparse-exact gradient sum. With replicas
(``replicate_variables``) the step's own optimizer updates the model's
variables only: each call first copies them to the replicas the towers read
(`Replicas.broadcast`, a ring all-reduce), and the towers' gradients are
ring all-reduced, tower 0's sum returned.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower._keras_compat import family
from kerastower.reduce import keys, workers
from kerastower.step.plan import ONE_DEVICE, StepPlan


def own_step_gradients(
    step,
    loss_fn: Callable[..., Any],
    variables: Sequence[Any],
    tensors: tuple[Any, ...],
    has_aux: bool,
) -> tuple:
    """Implements `TowerModel.tower_gradients` with the model's `TowerStep`."""
    model = step.model
    _check_context()
    variables = _check_variables(variables)
    if not callable(loss_fn):
        raise ValueError(
            "`loss_fn` must be a callable that returns the mean loss over the "
            f"examples it is given. Received: loss_fn={loss_fn!r}"
        )
    if not isinstance(has_aux, bool):
        raise ValueError(f"`has_aux` must be a bool. Received: has_aux={has_aux!r}")
    tensors = _check_tensors(tensors)

    def tower_loss(shard):
        return _unpack(loss_fn(*shard), has_aux)

    # The step's own optimizer updates the model's variables: no accumulator.
    plan = StepPlan.of(model, step.replicas if model.trainable_weights else None)
    if plan.towers == ONE_DEVICE:
        with tf.device(model.tower_devices[0]):
            with tf.GradientTape() as tape:
                loss, outputs = tower_loss(tensors)
            gradients = tape.gradient(loss, variables)
    else:
        replicas = plan.replicas
        if replicas is not None:
            # The step's optimizer updates the model's variables only.
            replicas.ensure(model.trainable_weights)
            replicas.broadcast()
        split = step.split_gradients(
            tower_loss, variables, tensors, plan, update_replicas=False
        )
        gradients, loss, outputs = split.gradients, split.loss, split.outputs
        if replicas is None:
            loss, gradients = workers.sum_gradients_over_workers(
                model, loss, gradients, split.static_rows
            )
        else:  # the replicas' ring spans every worker's towers
            loss = workers.sum_over_workers(model, loss)
    if has_aux:
        return gradients, loss, outputs
    return gradients, loss


def over_workers(train_step: Callable) -> Callable:
    """Wraps a subclass's own `train_step` for several workers.

    On several workers the metrics that the step updates (its loss tracker,
    ``self.compute_metrics``) count every worker's examples, as the built-in
    step's do, and the logs it returns under a metric's name hold that
    metric's result over all workers
    (`kerastower.reduce.workers.MetricsOverWorkers`). On one
    worker the step runs as written.
    """
    if getattr(train_step, "kerastower_over_workers", False):
        return train_step

    @functools.wraps(train_step)
    def wrapped(self, data):  # one worker: the step itself
        with (
            keys.step_keys(self, "train_step"),
            workers.MetricsOverWorkers(self) as over,
        ):
            logs = train_step(self, data)
        return over.logs(logs, keep_logs=True)

    wrapped.kerastower_over_workers = True
    return wrapped


def warn_if_not_split(cls: type, tower_train_step: Callable) -> None:
    """Warns when `cls` overrides `train_step` without `tower_gradients`.

    The check reads the names the override's code uses: a step that calls
    ``self.tower_gradients`` through a helper of its own still warns.
    """
    train_step = cls.train_step
    code = getattr(inspect.unwrap(train_step), "__code__", None)
    if train_step is tower_train_step or (
        code is not None and "tower_gradients" in code.co_names
    ):
        return
    warnings.warn(
        f"{cls.__name__} overrides `train_step`, so its training steps are not "
        "split across towers. Take the step's gradients with "
        "`self.tower_gradients`, or override `compute_loss` instead, to split "
        "them.",
        stacklevel=3,
    )


def _check_context() -> None:
    if tf.distribute.has_strategy():
        raise RuntimeError(
            "`tower_gradients` runs its own `tf.distribute` strategy on the "
            "towers, so it must not be called inside a strategy's scope or "
            "replica function (such as inside `loss_fn` or `Strategy.run`). "
            f"Received: strategy={tf.distribute.get_strategy()!r}"
        )


def _check_variables(variables) -> list:
    if family.is_variable(variables) or not isinstance(variables, Sequence):
        raise ValueError(
            "`variables` must be a list of variables, such as "
            "`self.trainable_weights`. Received: "
            f"variables={variables!r}"
        )
    variables = list(variables)
    for variable in variables:
        if not family.is_variable(variable):
            raise ValueError(
                "`variables` must be a list of variables, such as "
                "`self.trainable_weights`. Received: a "
                f"{type(variable).__name__} in variables: {variable!r}"
            )
    return variables


def _check_tensors(tensors: tuple) -> tuple:
    """Converts the leaves to tensors; checks that they share a batch size."""
    if not tensors or not [t for t in tf.nest.flatten(tensors) if t is not None]:
        raise ValueError(
            "`tower_gradients` needs at least one tensor to split, with the "
            "examples of the global batch on axis 0. Received: "
            f"tensors={tensors!r}"
        )

    def convert(leaf):
        if leaf is None:
            return None
        if isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor)):
            raise ValueError(
                "Every tensor must be dense to be split along axis 0 over the "
                f"towers. Received: a {type(leaf).__name__}"
            )
        tensor = tf.convert_to_tensor(leaf)
        if tensor.shape.rank == 0:
            raise ValueError(
                "Every tensor must have the examples of the global batch on "
                "axis 0; pass other values to `loss_fn` through its closure. "
                f"Received: a scalar tensor {tensor!r}"
            )
        return tensor

    tensors = tf.nest.map_structure(convert, tensors)
    leaves = [t for t in tf.nest.flatten(tensors) if t is not None]
    known = [t.shape[0] for t in leaves if t.shape[0] is not None]
    if len(set(known)) > 1:
        raise ValueError(
            "Every tensor must have the same batch size (axis 0), the global "
            "batch that is split over the towers. Received: tensors with "
            f"shapes {[tuple(t.shape) for t in leaves]}"
        )
    if len(known) < len(leaves):
        batch = tf.shape(leaves[0])[0]
        checks = [
            tf.debugging.assert_equal(
                tf.shape(leaf)[0],
                batch,
                message=(
                    "Every tensor must have the same batch size (axis 0), the "
                    "global batch that is split over the towers."
                ),
            )
            for leaf in leaves[1:]
        ]
        # The check must run before any op that would fail on the mismatch.
        with tf.control_dependencies([c for c in checks if c is not None]):
            tensors = tf.nest.map_structure(
                lambda t: None if t is None else tf.identity(t), tensors
            )
    return tensors


def _unpack(result, has_aux: bool):
    """A tower's ``(loss, outputs)`` from what `loss_fn` returned."""
    if has_aux:
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise ValueError(
                "With `has_aux=True`, `loss_fn` must return a pair "
                f"`(loss, outputs)`. Received: {result!r}"
            )
        loss, outputs = result
        for leaf in tf.nest.flatten(outputs):
            if leaf is None or tf.convert_to_tensor(leaf).shape.rank == 0:
                raise ValueError(
                    "The outputs `loss_fn` returns with `has_aux=True` must be "
                    "tensors with the examples on axis 0 (they are "
                    f"concatenated over the towers). Received: outputs={outputs!r}"
                )
    else:
        loss, outputs = result, ()
    if isinstance(loss, (tuple, list, dict)):
        raise ValueError(
            "`loss_fn` must return a scalar, the mean loss over the examples it "
            "is given; pass `has_aux=True` to return `(loss, outputs)`. "
            f"Received: {result!r}"
        )
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank != 0:
        raise ValueError(
            "`loss_fn` must return a scalar, the mean loss over the examples it "
            f"is given. Received: a loss of shape {tuple(loss.shape)}"
        )
    return loss, outputs
