"""`GradientAccumulation`: exact accumulation of micro-batches inside `fit`."""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.reduce.accumulation import (
    GradientWindow,
    steps_for_epoch,
    validate_steps,
)

_EPOCH_END_POLICIES = ("apply", "carry")


class GradientAccumulation(keras.callbacks.Callback):
    """Applies one optimizer update every `steps` micro-batches, exactly.

    Each batch that `fit` draws is a micro-batch (its size is the global batch
    size given to `fit`, split across towers as usual). Gradients of ``k``
    micro-batches with ``n_1, ..., n_k`` examples are combined as

    ``g = (n_1 g_1 + ... + n_k g_k) / (n_1 + ... + n_k)``

    so ``k`` micro-batches of ``b`` examples give the same weights and loss
    history as one device trained with batches of ``k * b`` examples; an
    uneven last micro-batch counts for its examples. The optimizer sees one
    step per update: its `iterations`, learning-rate schedules, clipping and
    weight decay act once per update, on the accumulated gradient. Weights
    change only after every ``k``-th micro-batch; callbacks still see every
    micro-batch.

    At the end of an epoch a partial window is applied by default, normalised
    by the examples it holds (as the short last batch of the one-device run);
    ``epoch_end="carry"`` carries it into the next epoch instead (what remains
    when training ends is applied then). The partial window is applied before
    validation runs.

    Memory: one extra copy of the trainable variables (the accumulators).
    `BatchNormalization` statistics are computed per micro-batch, so they are
    not those of the ``k * b`` batch. `kerastower.callbacks.BackupAndRestore`
    saves the window (its sums, examples and step), so a run resumed in the
    middle of a window goes on in that window. It accumulates the built-in
    training step: a model that overrides ``train_step`` applies its own
    updates, and gets an error at the end of the first epoch (one that calls
    ``super().train_step`` is accumulated).

    Example:

    ```python
    import keras
    import numpy as np

    import kerastower

    inputs = keras.Input((8,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(1000, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    accumulation = kerastower.callbacks.GradientAccumulation(4)
    model.fit(x, y, batch_size=32, epochs=2, callbacks=[accumulation])
    # One update per 4 x 32 = 128 examples, as one device with batch_size=128.
    ```

    Args:
        steps: Micro-batches per update, an integer >= 1 (1 turns accumulation
            off), or a dict ``{epoch: steps}`` (0-based epochs) that changes it
            from that epoch on.
        epoch_end: ``"apply"`` or ``"carry"``: what to do with a partial window
            at the end of an epoch. Defaults to ``"apply"``.

    Raises:
        ValueError: If `steps` or `epoch_end` is invalid, or (at the start of
            training) the model is not a `kerastower.TowerModel`, or its
            ``train_step`` does not accumulate (at the first epoch's end).
    """

    def __init__(self, steps: int | Mapping[int, int], epoch_end: str = "apply"):
        super().__init__()
        self.schedule = validate_steps(steps)
        if epoch_end not in _EPOCH_END_POLICIES:
            raise ValueError(
                f"`epoch_end` must be one of {_EPOCH_END_POLICIES}. "
                f"Received: epoch_end={epoch_end!r}"
            )
        self.epoch_end = epoch_end
        self._accumulator: GradientWindow | None = None
        self._apply_fn = None
        self._steps_per_epoch = None

    def on_train_begin(self, logs=None):
        model = self.model
        if not hasattr(model, "gradient_accumulator"):
            raise ValueError(
                "GradientAccumulation needs a kerastower.TowerModel. "
                f"Received: model of type {type(model).__name__}"
            )
        _keras_compat.build_optimizer(model.optimizer, model.trainable_variables)
        self._accumulator = GradientWindow(
            model.trainable_variables, steps_for_epoch(self.schedule, 0)
        )
        model.gradient_accumulator = self._accumulator
        optimizer = model.optimizer
        self._apply_fn = tf.function(lambda: self._accumulator.apply_pending(optimizer))
        self._steps_per_epoch = self.params.get("steps") if self.params else None

    def on_epoch_begin(self, epoch, logs=None):
        steps = steps_for_epoch(self.schedule, epoch)
        if steps != int(self._accumulator.steps.numpy()):
            self._apply_pending()
            self._accumulator.steps.assign(steps)

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch_end == "apply" and self._steps_per_epoch == batch + 1:
            self._apply_pending()

    def on_test_begin(self, logs=None):
        if self.epoch_end == "apply" and self._accumulator is not None:
            self._apply_pending()

    def on_epoch_end(self, epoch, logs=None):
        # At the epoch's end, as `BackupAndRestore` may have skipped its first
        # steps without running them.
        if not self._accumulator.used:
            raise ValueError(
                "GradientAccumulation accumulates TowerModel's own train_step; "
                "this model's train_step applies its updates itself "
                "(accumulate there instead). Received: model of type "
                f"{type(self.model).__name__}, whose steps accumulated nothing"
            )
        if self.epoch_end == "apply":
            self._apply_pending()

    def on_train_end(self, logs=None):
        self._apply_pending()
        self.model.gradient_accumulator = None
        self._accumulator = None

    def _apply_pending(self):
        if self._accumulator is not None and int(self._accumulator.examples.numpy()):
            self._apply_fn()

    @property
    def pending_examples(self) -> int:
        """The examples in the current window, not yet applied (0 when none)."""
        if self._accumulator is None:
            return 0
        return int(self._accumulator.examples.numpy())
