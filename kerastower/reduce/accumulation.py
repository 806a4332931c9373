"""Exact gradient accumulation state, and the math of its windows.

A window of ``k`` micro-batches with ``n_1, ..., n_k`` examples (global batch
sizes, all towers together) and mean-loss gradients ``g_1, ..., g_k`` applies
the gradient of the mean loss over all ``N = n_1 + ... + n_k`` examples::

    g = (n_1 g_1 + ... + n_k g_k) / N

which is the gradient one device computes on one batch of ``N`` examples: a
short last micro-batch counts for its examples, not for ``1 / k`` of the
window. Regularization gradients appear in every ``g_j`` and so once in ``g``.

A sparse gradient (`tf.IndexedSlices`, from `Embedding` and other gathers)
stays sparse in the window, with the rows one device's batch of ``N``
examples would have: the micro-batches' rows are concatenated in order, or,
for a table gathered once per batch, summed by index
(`kerastower.reduce.gradients.sum_gradients`, as for towers). Keras's optimizers
square each row of the slices on its own (Adam's second moment sums the
squared rows of a repeated index), so a window summed densely would train
another model.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import tensorflow as tf

from kerastower.reduce.gradients import sum_gradients


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


class Window:
    """One copy of a window's weighted gradient sums, on one device.

    A dense gradient ``g_j`` adds ``n_j g_j`` to a variable of its shape; a
    sparse one appends (or, for a fixed set of rows, sums by index) its rows
    times ``n_j`` to two variables of any length, its values and indices.

    Memory: the dense sum of a variable of rank >= 1 starts with no rows and
    takes its full shape when a step first adds a dense gradient to it, so a
    variable with sparse gradients (an embedding table) gets no dense copy.

    Args:
        variables: The trainable variables the gradients belong to (or
            anything with their ``shape`` and ``dtype``).
    """

    def __init__(self, variables: Sequence[Any]):
        self.dense_shapes = [tuple(v.shape) for v in variables]
        with tf.init_scope():
            self.sums = [
                tf.Variable(
                    tf.zeros([0, *shape[1:]] if shape else shape, v.dtype),
                    shape=tf.TensorShape([None, *shape[1:]] if shape else shape),
                    trainable=False,
                )
                for v, shape in zip(variables, self.dense_shapes)
            ]
            self.values = [
                tf.Variable(
                    tf.zeros([0, *v.shape[1:]], v.dtype),
                    shape=tf.TensorShape([None, *v.shape[1:]]),
                    trainable=False,
                )
                for v in variables
            ]
            self.indices = [
                tf.Variable(
                    tf.zeros([0], tf.int64),
                    shape=tf.TensorShape([None]),
                    trainable=False,
                )
                for _ in variables
            ]
        # Per variable: whether its gradients arrive as `tf.IndexedSlices`
        # (set when a step is traced, read when the window is applied).
        self.sparse = [False] * len(variables)

    def state(self) -> list[tf.Variable]:
        """Every variable of the window, for backups."""
        return [*self.sums, *self.values, *self.indices]

    def copy_to(self, device: str) -> Window:
        """A new window on `device` holding this window's current sums."""
        specs = [
            tf.TensorSpec(shape, total.dtype)
            for shape, total in zip(self.dense_shapes, self.sums)
        ]
        with tf.init_scope(), tf.device(device):
            copy = Window(specs)
            for mine, theirs in zip(self.state(), copy.state()):
                theirs.assign(mine)
        copy.sparse = list(self.sparse)
        return copy

    def _dense_sum(self, j: int) -> tf.Variable:
        """Variable `j`'s dense sum, given its full shape (of zeros) if empty."""
        total = self.sums[j]
        with tf.init_scope():
            if int(tf.size(total)) == 0 and self.dense_shapes[j]:
                total.assign(tf.zeros(self.dense_shapes[j], total.dtype))
        return total

    def add(self, gradients, indices, batch_size, static_rows) -> None:
        """Adds ``n_j g_j`` for the gradients of the variables at `indices`.

        `static_rows` holds the variables whose sparse gradients gather a
        fixed set of rows (see `kerastower.reduce.gradients.sum_gradients`).
        """
        for j, grad in zip(indices, gradients):
            if isinstance(grad, tf.IndexedSlices):
                self.sparse[j] = True
                scale = tf.cast(batch_size, grad.values.dtype)
                rows = tf.IndexedSlices(
                    grad.values * scale,
                    tf.cast(grad.indices, tf.int64),
                    grad.dense_shape,
                )
                held = tf.IndexedSlices(
                    self.values[j].value(), self.indices[j].value(), rows.dense_shape
                )
                total = sum_gradients([held, rows], j in static_rows)
                self.values[j].assign(total.values)
                self.indices[j].assign(total.indices)
            else:
                grad = tf.convert_to_tensor(grad)
                total = self._dense_sum(j)
                total.assign_add(grad * tf.cast(batch_size, grad.dtype))

    def gradients(self, indices, examples) -> list[Any]:
        """The window's gradients of the variables at `indices`, over `examples`."""
        out = []
        for j in indices:
            if self.sparse[j]:
                values = window_gradient(self.values[j].value(), examples)
                shape = tf.constant(self.dense_shapes[j], tf.int32)
                out.append(tf.IndexedSlices(values, self.indices[j].value(), shape))
            else:
                total = tf.ensure_shape(self.sums[j].value(), self.dense_shapes[j])
                out.append(window_gradient(total, examples))
        return out

    def reset(self) -> None:
        """Empties the window."""
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        for values, indices in zip(self.values, self.indices):
            values.assign(tf.zeros([0, *values.shape[1:]], values.dtype))
            indices.assign(tf.zeros([0], tf.int64))


class GradientWindow:
    """The window of the model's variables, its counters, and the replicas'.

    Memory: one extra copy of every trainable variable with dense gradients,
    plus, for a sparse gradient, the rows of the window's micro-batches, plus
    three scalars; with replicas (`attach`), as much again on each replica
    tower.

    Args:
        variables: The trainable variables of the model.
        steps: Micro-batches per update, an integer >= 1.
    """

    def __init__(self, variables: Sequence[tf.Variable], steps: int):
        self.variables = list(variables)
        self.window = Window(self.variables)
        with tf.init_scope():
            self.examples = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.micro_batches = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.steps = tf.Variable(steps, dtype=tf.int64, trainable=False)
        self.connected = [True] * len(self.variables)
        # Set when a step (traced or eager) accumulates: a `train_step` of
        # the model's own that never does would silently not accumulate.
        self.used = False
        self.replicas: Any = None
        self.replica_windows: list[Window] = []

    def state(self) -> list[tf.Variable]:
        """What a backup must hold to resume inside a window."""
        return [*self.window.state(), self.examples, self.micro_batches, self.steps]

    def attach(self, replicas: Any) -> None:
        """Keeps a window for each replica tower of `replicas` too.

        With `kerastower.reduce.replicas.Replicas`, every tower ``i >= 1`` receives
        the all-reduced gradient of each micro-batch and adds it to a window
        of its own, on its device (`accumulate_replica`), so the window's
        gradient never leaves the tower; when the model's window is applied,
        each tower applies its own with `Replicas.apply`. The windows start
        as copies of the model's: `BackupAndRestore` restores that window when
        an epoch begins, before the step is traced and attaches. Does nothing
        when already attached to `replicas`.

        Args:
            replicas: The `kerastower.reduce.replicas.Replicas` of `variables`.
        """
        if replicas is self.replicas:
            return
        self.replica_windows = [
            self.window.copy_to(device) for device in replicas.devices[1:]
        ]
        self.replicas = replicas

    def accumulate(
        self, gradients, batch_size, optimizer, static_rows: Collection[int] = ()
    ) -> None:
        """Adds one micro-batch and applies the window once it is full.

        Args:
            gradients: The micro-batch's mean-loss gradients, aligned with
                `variables` (``None`` for a variable without gradient).
            batch_size: The micro-batch's global batch size ``n_j``.
            optimizer: The optimizer that applies the window's gradient.
            static_rows: The indices of the variables whose sparse gradients
                gather a fixed set of rows.
        """
        self.connected = [g is not None for g in gradients]
        self.used = True
        batch_size = tf.cast(batch_size, tf.int64)
        indices = [j for j, g in enumerate(gradients) if g is not None]
        self.window.add(
            [gradients[j] for j in indices], indices, batch_size, static_rows
        )
        self.examples.assign_add(batch_size)
        self.micro_batches.assign_add(1)
        tf.cond(
            self.micro_batches >= self.steps,
            lambda: self._apply(optimizer),
            lambda: tf.constant(False),
        )

    def accumulate_replica(
        self,
        tower: int,
        gradients,
        indices: Sequence[int],
        batch_size,
        static_rows: Collection[int] = (),
    ) -> None:
        """Adds replica tower `tower`'s copy of a micro-batch's gradients.

        Args:
            tower: The replica tower, ``1 .. N-1``.
            gradients: The micro-batch's summed gradients on that tower, of
                the variables at `indices`.
            indices: Which of `variables` the gradients belong to.
            batch_size: The micro-batch's global batch size ``n_j``.
            static_rows: As for `accumulate`.
        """
        self.replica_windows[tower - 1].add(
            gradients, indices, tf.cast(batch_size, tf.int64), static_rows
        )

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
        for tower, window in enumerate(self.replica_windows, start=1):
            with tf.device(self.replicas.devices[tower]):
                gradients = window.gradients(indices, self.examples)
            self.replicas.apply(tower, gradients, indices)
        gradients = self.window.gradients(indices, self.examples)
        if self.replicas is None:
            variables = [self.variables[j] for j in indices]
            optimizer.apply_gradients(zip(gradients, variables))
        else:  # the model's update that the replicas' towers called
            self.replicas.apply(0, gradients, indices)
        self.reset()
        return tf.constant(True)

    def reset(self) -> None:
        """Drops the window's sums without applying them."""
        self.window.reset()
        for tower, window in enumerate(self.replica_windows, start=1):
            with tf.device(self.replicas.devices[tower]):
                window.reset()
        self.examples.assign(0)
        self.micro_batches.assign(0)
