"""`BatchScaling`: scale the learning rate with the global batch, with warmup."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from kerastower import _keras_compat, scaling
from kerastower._keras_compat import family
from kerastower._keras_compat.family import keras
from kerastower.callbacks.counting import loss_count
from kerastower.reduce import workers


@keras.saving.register_keras_serializable(package="kerastower")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A `LearningRateSchedule` multiplied by a factor that can change in training.

    ``ScaledSchedule(schedule)(step) = schedule(step) * factor``, where
    ``factor`` is a non-trainable `keras.Variable` so that a compiled training
    step reads its current value. `BatchScaling` wraps an optimizer's schedule
    in one and sets the factor at every batch; the factor is saved with the
    optimizer's config.

    Example:

    ```python
    import keras

    import kerastower

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 1000, 0.5)
    scaled = kerastower.callbacks.ScaledSchedule(decay, factor=4.0)
    print(float(scaled(0)))  # 0.4 = 0.1 * 4
    ```

    Args:
        schedule: The `LearningRateSchedule` to scale (or its serialized
            config).
        factor: The initial factor, a float. Defaults to ``1.0``.

    Raises:
        ValueError: If `schedule` is not a `LearningRateSchedule` (or the
            config of one).
    """

    def __init__(self, schedule: Any, factor: float = 1.0):
        if isinstance(schedule, dict):
            schedule = keras.optimizers.schedules.deserialize(schedule)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                "`schedule` must be a keras.optimizers.schedules.LearningRateSchedule. "
                f"Received: schedule={schedule!r}"
            )
        self.schedule = schedule
        self.factor = family.new_variable(
            float(factor), "float32", "lr_scale_factor", trainable=False
        )

    def __call__(self, step):
        value = tf.convert_to_tensor(self.schedule(step))
        return value * tf.cast(self.factor, value.dtype)

    def get_config(self) -> dict[str, Any]:
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "factor": float(tf.convert_to_tensor(self.factor).numpy()),
        }


def _innermost(optimizer: Any) -> Any:
    """Returns the optimizer that owns the learning rate (unwraps loss scaling)."""
    while hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


class BatchScaling(keras.callbacks.Callback):
    """Scales the learning rate with the global batch size, with gradual warmup.

    The user gives a **per-tower** batch size ``b`` and a learning rate
    ``lr_0`` tuned for a reference **global** batch of ``B_0`` examples. On one
    worker with ``N = model.num_towers`` towers (1 for a plain `keras.Model`)
    every step sees the global batch ``B = b * N``, which is what `fit` takes
    as ``batch_size``. On ``W = model.num_workers`` workers, worker ``i`` with
    ``N_i`` towers passes its own batch ``b * N_i`` to its `fit`, and every
    step sees the sum over workers, ``B = b * (N_1 + ... + N_W)``; workers may
    have different numbers of towers (the callback sums them over the workers
    once at the start of each `fit`, so every worker must use it). The target
    rate is

    - ``rule="linear"``: ``lr_target = lr_0 * B / B_0``;
    - ``rule="sqrt"``: ``lr_target = lr_0 * sqrt(B / B_0)``.

    At the start of batch ``j`` (0-based) of epoch ``k`` (0-based), with ``S``
    steps per epoch and ``E_w = warmup_epochs``, the rate is

    ``lr = lr_0 + (lr_target - lr_0) * min(e / E_w, 1)``,
    ``e = k + (j + 1) / S``

    (``lr_target`` throughout when ``E_w = 0``), the gradual warmup of Goyal et
    al. (2017). It depends only on ``(k, j, S)``: a run that resumes at
    ``initial_epoch = k`` (e.g. through `keras.callbacks.BackupAndRestore`)
    uses the same rates as an uninterrupted run. ``S`` is the number of steps
    `fit` reports to callbacks; with ``steps_per_execution > 1`` the rate is
    updated at the first step of each execution.

    A float learning rate is overwritten with ``lr`` at every batch (the
    optimizer's own initial value is not used). When the optimizer's learning
    rate is a `keras.optimizers.schedules.LearningRateSchedule`, the schedule's
    value is scaled instead: the optimizer uses
    ``schedule(step) * lr / lr_0 = schedule(step) * (1 + (s - 1) * min(e / E_w, 1))``
    with ``s = lr_target / lr_0``, through a `ScaledSchedule` that wraps the
    schedule (so for schedules ``lr_0`` only enters through ``s``). To decay
    the rate after warmup, use such a schedule.

    The epoch logs get a ``"learning_rate"`` entry (the optimizer's current
    rate), which `keras.callbacks.TensorBoard`, `keras.callbacks.CSVLogger` and
    the `History` show when they come after this callback in ``callbacks``.

    After the first step of each `fit`, the callback checks that the step saw
    ``B`` examples over all workers, counted by the model's ``loss`` metric,
    and raises an error that states both numbers and the ``batch_size`` this
    worker should pass otherwise (the learning rate would not match the
    batch). With ``steps_per_execution > 1`` the first execution is checked.

    Example:

    ```python
    import keras
    import numpy as np

    import kerastower

    kerastower.configure_logical_devices(4)  # without GPUs: 4 logical CPUs

    inputs = keras.Input((8,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs), towers=4)
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    scaling = kerastower.callbacks.BatchScaling(
        per_tower_batch_size=64,  # global batch 64 x 4 = 256
        base_learning_rate=0.1,  # tuned for a global batch of 32
        base_batch_size=32,
        warmup_epochs=5,  # 0.1 -> 0.1 * 256 / 32 = 0.8 over 5 epochs
    )
    x = np.random.default_rng(0).normal(size=(2560, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model.fit(
        x,
        y,
        batch_size=64 * model.num_towers,  # this worker's batch: 256
        epochs=10,
        callbacks=[scaling, keras.callbacks.CSVLogger("log.csv")],  # logs the rate
    )
    ```

    Args:
        per_tower_batch_size: The number of examples each tower processes per
            step, an integer >= 1.
        base_learning_rate: ``lr_0``, the learning rate tuned for a global
            batch of `base_batch_size` examples, a finite number > 0.
        base_batch_size: ``B_0``, the global batch size `base_learning_rate`
            was tuned for, an integer >= 1.
        rule: ``"linear"`` or ``"sqrt"``. Defaults to ``"linear"``.
        warmup_epochs: ``E_w``, how many epochs the rate takes to rise from
            ``lr_0`` to ``lr_target``, a number >= 0 (fractions allowed).
            Defaults to ``0`` (no warmup).

    Raises:
        ValueError: If a size is not an integer >= 1, `base_learning_rate` is
            not > 0, `rule` is unknown or `warmup_epochs` is negative; at the
            start of `fit`, if warmup is asked for but `fit` does not know the
            number of steps per epoch, or the optimizer's learning rate is a
            callable that is not a `LearningRateSchedule`; after the first step,
            if the batch was not the expected global batch.

    Attributes:
        global_batch_size: ``B``, the examples of one step over all towers
            and workers; ``None`` until `fit` starts.
        worker_batch_size: ``b * model.num_towers``, this worker's batch (what
            its `fit` takes as ``batch_size``); ``None`` until `fit` starts.
        target_learning_rate: ``lr_target``; ``None`` until `fit` starts.
    """

    def __init__(
        self,
        per_tower_batch_size: int,
        base_learning_rate: float,
        base_batch_size: int,
        rule: str = "linear",
        warmup_epochs: float = 0,
    ):
        super().__init__()
        self.per_tower_batch_size = scaling.check_positive_int(
            "per_tower_batch_size", per_tower_batch_size
        )
        self.base_learning_rate = scaling.check_positive_float(
            "base_learning_rate", base_learning_rate
        )
        self.base_batch_size = scaling.check_positive_int(
            "base_batch_size", base_batch_size
        )
        self.rule = scaling.check_rule(rule)
        self.warmup_epochs = scaling.check_warmup_epochs(warmup_epochs)
        self.global_batch_size: int | None = None
        self.worker_batch_size: int | None = None
        self.target_learning_rate: float | None = None
        self._towers = self._workers = self._all_towers = 1
        self._steps: int | None = None
        self._factor: keras.Variable | None = None
        self._epoch = 0
        self._first_step = 0
        self._checked = False

    def learning_rate_at(self, epoch: int, batch: int) -> float:
        """Returns ``lr`` at the start of batch `batch` of epoch `epoch`.

        Only valid once `fit` has started (the global batch comes from the
        model). With a `LearningRateSchedule` this is the rate before the
        schedule's value is applied: the factor is ``lr / lr_0``.

        Args:
            epoch: The 0-based epoch index ``k``.
            batch: The 0-based batch index ``j`` within the epoch.

        Returns:
            ``lr = lr_0 + (lr_target - lr_0) * min(e / E_w, 1)`` with
            ``e = k + (j + 1) / S``, as a float.

        Raises:
            ValueError: If `fit` has not started yet.
        """
        if self.target_learning_rate is None:
            raise ValueError(
                "`learning_rate_at` needs the model's tower count; call it once "
                "`fit` has started."
            )
        return scaling.warmup_learning_rate(
            epoch,
            batch,
            self._steps,
            self.base_learning_rate,
            self.target_learning_rate,
            self.warmup_epochs,
        )

    def on_train_begin(self, logs=None):
        _keras_compat.check_execution_steps(self.model, "BatchScaling")
        self._towers, self._workers = scaling.towers_and_workers(self.model)
        self._all_towers = self._count_all_towers()
        self.worker_batch_size = self.per_tower_batch_size * self._towers
        self.global_batch_size = self.per_tower_batch_size * self._all_towers
        self.target_learning_rate = scaling.target_learning_rate(
            self.base_learning_rate,
            self.base_batch_size,
            self.global_batch_size,
            self.rule,
        )
        self._steps = self.params.get("steps")
        if self.warmup_epochs > 0 and not self._steps:
            raise ValueError(
                "`BatchScaling` with warmup needs the number of steps per epoch, "
                "which `fit` cannot infer from this data; pass `steps_per_epoch` "
                f"to `fit`. Received: steps={self._steps!r}, "
                f"warmup_epochs={self.warmup_epochs}"
            )
        self._factor = self._attach(self.model.optimizer)
        self._checked = False

    def _count_all_towers(self) -> int:
        """The towers of all workers: one sum over the workers (they may differ)."""
        if self._workers == 1:
            return self._towers
        mine = np.float32(self._towers)
        total = workers.all_reduce_sum(self.model.worker_strategy, mine)
        return int(round(float(total)))

    def _attach(self, optimizer: Any) -> keras.Variable | None:
        """Returns the variable that scales a schedule, or None for a float rate."""
        owner = _innermost(optimizer)
        current = _keras_compat.learning_rate_slot(owner)
        if isinstance(current, ScaledSchedule):
            return current.factor
        if isinstance(current, keras.optimizers.schedules.LearningRateSchedule):
            scaled = ScaledSchedule(current)
            owner.learning_rate = scaled
            # A step traced by an earlier `fit` would keep calling the old schedule.
            self.model.make_train_function(force=True)
            return scaled.factor
        if callable(current) and not family.is_variable(current):
            raise ValueError(
                "`BatchScaling` supports a float learning rate or a "
                "keras.optimizers.schedules.LearningRateSchedule. "
                f"Received: learning_rate={current!r}"
            )
        return None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if not self._checked:
            self._first_step = batch
        value = self.learning_rate_at(self._epoch, batch)
        if self._factor is None:
            self.model.optimizer.learning_rate = value
        else:
            self._factor.assign(value / self.base_learning_rate)

    def on_train_batch_end(self, batch, logs=None):
        if not self._checked:
            self._checked = True
            self._check_batch_size(batch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(
                tf.convert_to_tensor(self.model.optimizer.learning_rate).numpy()
            )

    def _check_batch_size(self, last_step: int) -> None:
        expected = self.global_batch_size
        examples = loss_count(self.model) or 0
        if examples == 0:
            warnings.warn(
                "`BatchScaling` could not check the global batch size: the "
                "model's `loss` metric counted no example in the first step "
                "(does a custom `train_step` skip it?).",
                stacklevel=2,
            )
            return
        ends_epoch = self._steps is not None and last_step + 1 >= self._steps
        if ends_epoch:
            last_step = self._steps - 1
        steps = last_step - self._first_step + 1
        if examples == steps * expected:
            return
        if (
            steps > 1
            and ends_epoch
            and (steps - 1) * expected < examples < steps * expected
        ):
            return  # The last batch of a short epoch may be partial.
        seen = (
            f"the first batch had {examples} examples"
            if steps == 1
            else f"the first {steps} batches had {examples} examples in all, "
            f"not {steps} x {expected}"
        )
        per_tower = self.per_tower_batch_size
        if self._workers == 1:
            raise ValueError(
                f"`BatchScaling` expects global batches of {expected} examples "
                f"(per_tower_batch_size={per_tower} x {self._towers} towers x "
                f"1 workers), but {seen}. Pass `batch_size={expected}` to `fit`, "
                "or batch a dataset with `kerastower.batch_for_towers`. "
                f"Received: batch_size={examples / steps:g}; expected "
                f"global_batch_size={expected}"
            )
        raise ValueError(
            f"`BatchScaling` expects global batches of {expected} examples "
            f"(per_tower_batch_size={per_tower} x {self._all_towers} towers "
            f"over {self._workers} workers), but {seen} over all workers. "
            f"Pass `batch_size={self.worker_batch_size}` to `fit` on this worker "
            f"(per_tower_batch_size={per_tower} x its {self._towers} towers; "
            "every worker passes its own towers' batch), or batch each worker's "
            "dataset with `kerastower.batch_for_towers`. "
            f"Received: global batch of {examples / steps:g}; expected "
            f"global_batch_size={expected}"
        )
