"""Exact gradient accumulation state, and the math of its windows.

A window of ``k`` micro-batches with ``n_1, ..., n_k`` examples (global batch
sizes, all towers together) and mean-loss gradients ``g_1, ..., g_k`` applies
the gradient of the mean loss over all ``N = n_1 + ... + n_k`` examples::

    g = (n_1 g_1 + ... + n_k g_k) / N

which is the gradient one device computes on one batch of ``N`` examples: a
short last micro-batch counts for its examples, not for ``1 / k`` of the
window. Regularization gradients appear in every ``g_j`` and so once in ``g``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf


def validate_steps(steps: int | Mapping[int, int]) -> dict[int, int]:
    """Checks `steps` and returns it as a schedule ``{first_epoch: steps}``.

    Args:
        steps: An integer >= 1 (1 turns accumulation off), or a dict mapping a
            0-based epoch to the number of micro-batches per update from that
            epoch on (as Lightning's `GradientAccumulationScheduler`).

    Returns:
        The schedule as a dict; epoch 0 defaults to 1 when not given.

    Raises:
        ValueError: If a step count is not an integer >= 1 or an epoch is not
            an integer >= 0.
    """

    def check_count(value):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(
                f"`steps` must be an integer >= 1 or a dict {{epoch: steps}}. "
                f"Received: steps={steps!r}"
            )

    if isinstance(steps, Mapping):
        if not steps:
            raise ValueError(
                f"`steps` must not be an empty dict. Received: steps={steps!r}"
            )
        for epoch, value in steps.items():
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
                raise ValueError(
                    "`steps` dict keys must be epochs, integers >= 0. "
                    f"Received: steps={steps!r}"
                )
            check_count(value)
        schedule = {0: 1}
        schedule.update(dict(steps))
        return schedule
    check_count(steps)
    return {0: steps}


def steps_for_epoch(schedule: Mapping[int, int], epoch: int) -> int:
    """Returns the number of micro-batches per update in `epoch` (0-based)."""
    return schedule[max(e for e in schedule if e <= epoch)]


def window_gradient(weighted_sum: tf.Tensor, examples: tf.Tensor) -> tf.Tensor:
    """Returns ``sum_j n_j g_j / N``, the gradient of the window's mean loss."""
    return weighted_sum / tf.cast(examples, weighted_sum.dtype)


class GradientAccumulator:
    """Accumulators for one copy of the trainable variables, and a counter.

    Memory: one extra copy of every trainable variable (dense, even for
    gradients that arrive as `tf.IndexedSlices`), plus two scalars; with
    replicas (`attach`), one more on each replica tower.

    Args:
        variables: The trainable variables of the model.
        steps: Micro-batches per update, an integer >= 1.
    """

    def __init__(self, variables: Sequence[tf.Variable], steps: int):
        self.variables = list(variables)
        with tf.init_scope():
            self.sums = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
                for v in self.variables
            ]
            self.examples = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.micro_batches = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.steps = tf.Variable(steps, dtype=tf.int64, trainable=False)
        self.connected = [True] * len(self.variables)
        # Set when a step (traced or eager) accumulates: a `train_step` of
        # the model's own that never does would silently not accumulate.
        self.used = False
        self.replicas: Any = None
        self.replica_sums: list[list[tf.Variable]] = []

    def attach(self, replicas: Any) -> None:
        """Keeps a window for each replica tower of `replicas` too.

        With `kerastower.replicas.Replicas`, every tower ``i >= 1`` receives
        the all-reduced gradient of each micro-batch and adds it to sums of
        its own, on its device (`accumulate_replica`), so the window's
        gradient never leaves the tower; when the model's window is applied,
        each tower applies its own with `Replicas.apply`. The sums start as
        copies of the model's window: `BackupAndRestore` restores that
        window when an epoch begins, before the step is traced and attaches.
        Does nothing when already attached to `replicas`.

        Args:
            replicas: The `kerastower.replicas.Replicas` of `variables`.
        """
        if replicas is self.replicas:
            return
        with tf.init_scope():
            self.replica_sums = []
            for device in replicas.devices[1:]:
                with tf.device(device):
                    self.replica_sums.append(
                        [
                            tf.Variable(tf.identity(s), trainable=False)
                            for s in self.sums
                        ]
                    )
        self.replicas = replicas

    def accumulate(self, gradients, batch_size, optimizer) -> None:
        """Adds one micro-batch and applies the window once it is full.

        Args:
            gradients: The micro-batch's mean-loss gradients, aligned with
                `variables` (``None`` for a variable without gradient).
            batch_size: The micro-batch's global batch size ``n_j``.
            optimizer: The optimizer that applies the window's gradient.
        """
        self.connected = [g is not None for g in gradients]
        self.used = True
        batch_size = tf.cast(batch_size, tf.int64)
        for total, grad in zip(self.sums, gradients):
            if grad is not None:
                grad = tf.convert_to_tensor(grad)
                total.assign_add(grad * tf.cast(batch_size, grad.dtype))
        self.examples.assign_add(batch_size)
        self.micro_batches.assign_add(1)
        tf.cond(
            self.micro_batches >= self.steps,
            lambda: self._apply(optimizer),
            lambda: tf.constant(False),
        )

    def accumulate_replica(
        self, tower: int, gradients, indices: Sequence[int], batch_size
    ) -> None:
        """Adds replica tower `tower`'s copy of a micro-batch's gradients.

        Args:
            tower: The replica tower, ``1 .. N-1``.
            gradients: The micro-batch's summed gradients on that tower, of
                the variables at `indices`.
            indices: Which of `variables` the gradients belong to.
            batch_size: The micro-batch's global batch size ``n_j``.
        """
        sums = self.replica_sums[tower - 1]
        for j, grad in zip(indices, gradients):
            grad = tf.convert_to_tensor(grad)
            sums[j].assign_add(grad * tf.cast(batch_size, grad.dtype))

    def apply_pending(self, optimizer) -> None:
        """Applies a partial window now (e.g. at the end of an epoch)."""
        tf.cond(
            self.examples > 0,
            lambda: self._apply(optimizer),
            lambda: tf.constant(False),
        )

    def _apply(self, optimizer) -> tf.Tensor:
        # The replicas first: their optimizers copy `optimizer`'s step count
        # before it applies.
        indices = [j for j, connected in enumerate(self.connected) if connected]
        for tower, sums in enumerate(self.replica_sums, start=1):
            with tf.device(self.replicas.devices[tower]):
                window = [window_gradient(sums[j], self.examples) for j in indices]
            self.replicas.apply(tower, window, indices)
        pairs = [
            (window_gradient(total, self.examples), variable)
            for total, variable, connected in zip(
                self.sums, self.variables, self.connected
            )
            if connected
        ]
        optimizer.apply_gradients(pairs)
        self.reset()
        return tf.constant(True)

    def reset(self) -> None:
        """Drops the window's sums without applying them."""
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        for tower, sums in enumerate(self.replica_sums, start=1):
            with tf.device(self.replicas.devices[tower]):
                for total in sums:
                    total.assign(tf.zeros_like(total))
        self.examples.assign(0)
        self.micro_batches.assign(0)
