"""Which way one step runs, decided once per trace: `StepPlan`.

A `TowerModel`'s settings (towers, workers, replicas, XLA, gradient
accumulation) choose between a few ways to run a step. `StepPlan.of` makes
that choice once, when the step traces; `TowerModel.train_step`,
`test_step`, the built-in steps (`kerastower.step.tower_step.TowerStep`), the
towers' runs (`kerastower.step.tower_runs`) and a subclass's
`TowerModel.tower_gradients` (`kerastower.step.custom_step`) all read the
plan they are given instead of deciding again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.step import traced_towers

# One tower on one worker: Keras's own step, on the tower's device.
ONE_DEVICE = "one device"
# One tower function traced once, called on every device.
TRACED_ONCE = "traced once"
# One copy of the tower traced per tower, inside `tf.distribute.Strategy.run`.
COPIES = "copies"


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one step of a `TowerModel` runs.

    Attributes:
        towers: `ONE_DEVICE`; `TRACED_ONCE` where the settings allow
            (`kerastower.step.traced_towers.applies`) and the step is
            traced; else `COPIES` (XLA, ``global_batch_loss`` on several
            workers, Keras 2's random layers, TensorFlow 2.12 to 2.14,
            a step run eagerly).
        replicas: The `kerastower.reduce.replicas.Replicas` the towers read
            and update, or ``None`` for towers reading the model's variables.
        workers: The number of workers whose towers make one step.
        xla: Whether each tower is compiled with XLA (traced steps only).
        accumulator: The `kerastower.reduce.accumulation.GradientWindow`
            that a training step adds its gradients to instead of applying
            them, or ``None``.
        shown_warnings: The warnings already shown when the model was built
            for its steps, which the step's trace does not show again.
    """

    towers: str
    replicas: Any = None
    workers: int = 1
    xla: bool = False
    accumulator: Any = None
    shown_warnings: frozenset = frozenset()

    @classmethod
    def of(
        cls,
        model,
        replicas: Any = None,
        accumulator: Any = None,
        across_workers: bool = True,
    ) -> StepPlan:
        """The plan of `model`'s step being traced (or run eagerly) now.

        Args:
            model: The `kerastower.TowerModel`.
            replicas: Its `Replicas`, or ``None``.
            accumulator: Its `GradientWindow`, or ``None``.
            across_workers: Whether the step spans the workers (``False``
                for prediction, which each worker makes on its own batch).
        """
        traced = not tf.executing_eagerly()
        workers = model.num_workers if across_workers else 1
        if model.num_towers == 1 and workers == 1:
            towers = ONE_DEVICE
        elif (
            traced
            and _keras_compat.orders_calls_here()
            and traced_towers.applies(model, workers)
        ):
            towers = TRACED_ONCE
        else:
            towers = COPIES
        return cls(
            towers=towers,
            replicas=replicas,
            workers=workers,
            xla=bool(model.jit_compile) and traced,
            accumulator=accumulator,
            shown_warnings=_keras_compat.warnings_shown_at_build(model),
        )

    @property
    def keras_step(self) -> bool:
        """Whether training runs Keras's own `train_step`: one device, with
        nothing accumulated."""
        return self.towers == ONE_DEVICE and self.accumulator is None
