"""The replicas' optimizer updates, traced once for every tower.

With replicas (`kerastower.reduce.replicas`), tower ``i >= 1`` applies the
all-reduced gradient ``g`` to its replicas ``w_i`` with its own clone of the
model's optimizer, after copying the optimizer's scalar state (``iterations``,
the learning rate, a loss scale)::

    state_i <- scalars(state);  w_i, slots_i <- update(w_i, g, slots_i)

Traced clone by clone, a step holds ``N - 1`` copies of the optimizer's
update of every variable, and tracing and optimising them grew the first
step with the tower count. Here tower 1's update is traced once, as a
function that reads and writes tower 1's replicas and clone state through
their resource handles, and tower ``i`` calls it with its own variables'
handles in their place (`kerastower._keras_compat.call_with_captures`): the
same ops, on tower ``i``'s variables, on their device. Each tower's update
is the one its clone would trace: bit for bit the same arithmetic. The
calls are inlined into the step: called as functions, they saved 0.9 s of
10 s of the first step on 8 towers, but TensorFlow optimised the update
apart from the model's own, and a learning-rate schedule's float32
arithmetic then rounded differently there (replicas 1 ulp off).

A traced update that touches any other variable than tower 1's replicas,
its clone's state and the model's optimizer's state (a learning-rate
schedule with a variable of its own, say) could not be pointed at another
tower's; each clone then traces its own update, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat


def sync_and_apply(primary: Any, clone: Any, gradients, variables) -> None:
    """Copies `primary`'s scalar state to `clone`, then applies `gradients`.

    The scalars (``iterations``, the learning rate, a loss scale) make the
    clone take the very update the model's optimizer takes: apply before it
    applies the same gradients.
    """
    for source, state in zip(primary.variables, clone.variables):
        if len(state.shape) == 0:
            state.assign(source.value)
    clone.apply_gradients(zip(gradients, variables))


def _spec(gradient: Any, variable: Any) -> Any:
    """The `tf.TypeSpec` of a gradient of `variable`, any number of rows."""
    if isinstance(gradient, tf.IndexedSlices):
        dense = gradient.dense_shape
        return tf.IndexedSlicesSpec(
            shape=variable.shape,
            dtype=gradient.dtype,
            indices_dtype=gradient.indices.dtype,
            dense_shape_dtype=None if dense is None else dense.dtype,
            indices_shape=[None],
        )
    return tf.TensorSpec(variable.shape, gradient.dtype)


class CloneUpdates:
    """Applies each tower's all-reduced gradients with its optimizer clone.

    Args:
        optimizer: The model's optimizer (tower 0's).
        clones: The clones of towers ``1 .. N-1``, in tower order.
        copies: Their replicas, one list per tower ``1 .. N-1``, each in the
            order of the model's trainable variables.
    """

    def __init__(
        self, optimizer: Any, clones: Sequence[Any], copies: Sequence[Sequence[Any]]
    ):
        self.optimizer = optimizer
        self.clones = list(clones)
        self.copies = [list(c) for c in copies]
        self._traced: dict[tuple, Any] = {}

    def apply(self, tower: int, gradients: Sequence[Any], indices: Sequence[int]):
        """Applies `gradients` to tower `tower`'s replicas at `indices`."""
        copies, clone = self.copies[tower - 1], self.clones[tower - 1]
        variables = [copies[j] for j in indices]
        function = self._function(gradients, indices) if len(self.clones) > 1 else None
        if function is None:
            sync_and_apply(self.optimizer, clone, gradients, variables)
            return
        first = self._handles(1)
        replace = dict(zip([id(h) for h in first], self._handles(tower)))
        inputs = tf.nest.flatten(list(gradients), expand_composites=True)
        _keras_compat.call_with_captures(function, inputs, replace)

    def _handles(self, tower: int) -> list[tf.Tensor]:
        """Tower `tower`'s replicas' and clone state's resource handles."""
        clone = self.clones[tower - 1]
        return [v.handle for v in [*self.copies[tower - 1], *clone.variables]]

    def _function(self, gradients: Sequence[Any], indices: Sequence[int]):
        """Tower 1's update traced once, or ``None`` where it cannot be shared."""
        variables = [self.copies[0][j] for j in indices]
        specs = [_spec(g, v) for g, v in zip(gradients, variables)]
        key = (tuple(indices), tuple(specs))
        if key not in self._traced:

            def update(grads):
                sync_and_apply(self.optimizer, self.clones[0], grads, variables)

            with tf.init_scope():  # traced apart from the step, on no device
                function = tf.function(update, autograph=False)
                function = function.get_concrete_function(specs)
            known = {id(h) for h in self._handles(1)}
            known |= {id(v.handle) for v in self.optimizer.variables}
            shared = all(
                c.dtype != tf.resource or id(c) in known
                for c in function.captured_inputs
            )
            self._traced[key] = function if shared else None
        return self._traced[key]
