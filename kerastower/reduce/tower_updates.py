"""Every tower's optimizer update, traced once.

With replicas (`kerastower.reduce.replicas`), every tower applies the same
all-reduced gradient ``g``: tower 0 to the model's variables ``w`` with the
model's optimizer, tower ``i >= 1`` to its replicas ``w_i`` with its clone
of that optimizer, after copying the optimizer's scalar state
(``iterations``, the learning rate, a loss scale) into the clone::

    w, slots <- update(w, g, slots)
    state_i <- scalars(state);  w_i, slots_i <- update(w_i, g, slots_i)

Traced optimizer by optimizer, a step holds ``N`` copies of the update of
every variable, and tracing them grew the first step with the tower count.
Here the model's optimizer's update is traced once, as a function that
reads and writes the model's variables and the optimizer's state through
their resource handles; tower 0 calls it as it is, and tower ``i`` with its
replicas' and its clone's handles in their place
(`kerastower._keras_compat.call_with_captures`): the same ops, on tower
``i``'s variables, on their device. Each tower's update is the model's,
bit for bit the same arithmetic.

From TensorFlow 2.15 the update is one function kept apart from the step:
its body gets one round of Grappler's kernel passes, once
(`kerastower._keras_compat.optimised_once`, as the towers' function does),
and its calls skip Grappler. The step's own round of Grappler then sees
``N`` calls, not ``N`` inlined copies of the update (ResNet50 on 4 towers:
1,621 nodes, not 5,937). Calls that each device's instantiation optimised
apart rounded a learning-rate schedule's float32 arithmetic differently on
tower 0 than on the others (replicas 1 ulp off); optimised once, every
tower runs the same body. On TensorFlow 2.12 to 2.14 the calls are inlined
into the step.

A traced update that touches any other variable than the model's and its
optimizer's (a learning-rate schedule with a variable of its own, say) could
not be pointed at another tower's: each optimizer then traces its own
update, tower 0's as Keras does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat


def copy_scalars(primary: Any, clone: Any) -> None:
    """Copies `primary`'s scalar state (``iterations``, the learning rate, a
    loss scale) to `clone`, so that the clone takes the very update that
    `primary` takes: copy before `primary` applies the same gradients."""
    for source, state in zip(primary.variables, clone.variables):
        if len(state.shape) == 0:
            state.assign(source.value)


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


class TowerUpdates:
    """Applies each tower's all-reduced gradients with its optimizer.

    Args:
        optimizer: The model's optimizer (tower 0's).
        primaries: The model's replicated variables (tower 0's).
        clones: The optimizer's clones of towers ``1 .. N-1``, in tower
            order, each holding its state in the order of `optimizer`'s.
        copies: Their replicas, one list per tower ``1 .. N-1``, each in the
            order of `primaries`.
        devices: The towers' devices, tower 0's first.
    """

    def __init__(
        self,
        optimizer: Any,
        primaries: Sequence[Any],
        clones: Sequence[Any],
        copies: Sequence[Sequence[Any]],
        devices: Sequence[str],
    ):
        self.devices = list(devices)
        self.optimizer = optimizer
        self.primaries = list(primaries)
        self.clones = list(clones)
        self.copies = [list(c) for c in copies]
        self._traced: dict[tuple, Any] = {}

    def apply(self, tower: int, gradients: Sequence[Any], indices: Sequence[int]):
        """Applies `gradients` to tower `tower`'s variables at `indices`.

        Tower ``i >= 1`` first copies the model's optimizer's scalar state:
        apply every other tower before tower 0.
        """
        if tower == 0:
            variables = [self.primaries[j] for j in indices]
        else:
            clone = self.clones[tower - 1]
            variables = [self.copies[tower - 1][j] for j in indices]
            copy_scalars(self.optimizer, clone)
        call = self._function(gradients, indices)
        if call is None:
            optimizer = self.optimizer if tower == 0 else clone
            optimizer.apply_gradients(zip(gradients, variables))
            return
        replace = (
            {}
            if tower == 0
            else dict(zip([id(h) for h in self._handles(0)], self._handles(tower)))
        )
        call(tower, list(gradients), replace)

    def _handles(self, tower: int) -> list[tf.Tensor]:
        """Tower `tower`'s variables' and optimizer state's resource handles."""
        if tower == 0:
            variables = [*self.primaries, *self.optimizer.variables]
        else:
            variables = [*self.copies[tower - 1], *self.clones[tower - 1].variables]
        return [v.handle for v in variables]

    def _function(self, gradients: Sequence[Any], indices: Sequence[int]):
        """The model's update traced once, or ``None`` where it cannot be
        pointed at another tower's variables."""
        variables = [self.primaries[j] for j in indices]
        specs = [_spec(g, v) for g, v in zip(gradients, variables)]
        key = (tuple(indices), tuple(specs))
        if key not in self._traced:

            def update(grads):
                self.optimizer.apply_gradients(zip(grads, variables))

            with tf.init_scope():  # traced apart from the step, on no device
                function = tf.function(
                    update, autograph=False, experimental_attributes=_NOT_INLINED
                )
                function = function.get_concrete_function(specs)
            known = {id(h) for h in self._handles(0)}
            shared = all(
                c.dtype != tf.resource or id(c) in known
                for c in function.captured_inputs
            )
            self._traced[key] = self._caller(function) if shared else None
        return self._traced[key]

    def _caller(self, function: Any) -> Callable[[int, list, dict], None]:
        """Calls `function` for a tower, on its gradients, with the captured
        handles that `replace` maps replaced by the tower's."""
        if _NOT_INLINED is None:

            def inlined(tower, gradients, replace):
                inputs = tf.nest.flatten(gradients, expand_composites=True)
                _keras_compat.call_with_captures(function, inputs, replace)

            return inlined
        optimised = _keras_compat.optimised_once(
            function, self.devices[0], _keras_compat.kernel_passes(self.devices)
        )

        def called(tower, gradients, replace):
            captures = [replace.get(id(c), c) for c in function.captured_inputs]
            with (
                tf.device(self.devices[tower]),
                _keras_compat.calls_without_graph_optimizer(),
                _keras_compat.calls_without_shape_inference(),
            ):
                optimised.call_with([gradients], captures)

        return called


# One function for every tower's update where TensorFlow can keep it apart
# from the step and optimise its body once (from 2.15).
_NOT_INLINED = {"_noinline": True} if _keras_compat.keeps_functions_apart() else None
