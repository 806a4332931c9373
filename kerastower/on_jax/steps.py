"""The step functions of a JAX `TowerModel`: Keras's own steps, compiled for
the towers' mesh.

Keras's JAX trainer calls a step function as ``function(state, iterator)``
(`kerastower._keras_compat.jax`); these run the model's ``train_step``,
``test_step`` or ``predict_step`` (Keras's, or a subclass's own) with the
variables replicated and each batch laid out by `Placement.batch`, compiled
by `jax.jit` with the new variables kept replicated (``out_shardings``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from kerastower.on_jax.placement import Placement

Step = Callable[[tuple, object], tuple]


def compile_step(model, step: Step, placement: Placement) -> Step:
    """`step` of `model` over the towers of `placement`.

    Compiled as Keras compiles it (``jit_compile``, ``run_eagerly``, the
    state donated), with the variables' new values replicated on every
    tower. One compilation per batch shape and layout: ``fit`` on batches
    of 32 with a last batch of 17 on 4 towers compiles two.
    """
    if model.run_eagerly or not model.jit_compile:
        compiled = step
    else:
        compiled = jax.jit(
            step, donate_argnums=0, out_shardings=(None, placement.replicated)
        )

    def run(state, data):
        return compiled(placement.state(state), placement.batch(data))

    return run


def iterate(run: Step, steps_per_execution: int, concatenate: bool = False):
    """The function Keras calls, ``function(state, iterator)``: `run` on the
    next ``steps_per_execution`` batches of `iterator`, as Keras's own.

    Args:
        run: A compiled step (`compile_step`).
        steps_per_execution: The model's ``steps_per_execution``.
        concatenate: Whether the batches' outputs are joined (``predict``)
            rather than the last batch's returned (``fit``, ``evaluate``:
            the metrics accumulate in the state).
    """

    def function(state, iterator):
        outputs, state = run(state, next(iterator))
        gathered = [outputs]
        for _ in range(steps_per_execution - 1):
            try:
                data = next(iterator)
            except StopIteration:
                break
            outputs, state = run(state, data)
            gathered.append(outputs)
        if concatenate and len(gathered) > 1:
            outputs = jax.tree.map(lambda *parts: jnp.concatenate(parts), *gathered)
        return outputs, state

    return function


def predict_with_state(model) -> Step:
    """``predict_step`` returning the state Keras's ``predict`` expects:
    ``(outputs, (trainable values, non-trainable values))``."""

    def step(state, data):
        outputs, non_trainable = model.predict_step(state, data)
        return outputs, (state[0], non_trainable)

    return step
