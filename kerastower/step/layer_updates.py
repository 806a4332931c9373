"""Weights that layers assign in the forward pass, updated once per step.

Some layers assign their own weights while they train: `BatchNormalization`
its moving statistics, `SpectralNormalization` its ``vector_u`` and kernel,
a layer of the user's a counter or a running average. One device makes each
assignment once per step. Towers tracing one after another would make it
once per tower, each tower reading what the one before it assigned: a
counter would advance ``N`` times per step, a spectrally normalised kernel
be divided ``N`` times.

A training step therefore runs in two parts (`step_state`, `tower_reads`):

1. Before the towers, `SpectralNormalization`'s update runs once: a power
   iteration ``u' = power_iteration(u, W)`` and ``W' = W / sigma(u', W)``
   are assigned, and ``W'`` is copied to every tower's replica with
   ``replicate_variables=True``. While the towers run, such a layer assigns
   the values it reads, so every tower reads ``W'`` and ``u'`` and takes its
   gradient at ``W'``, as one device does. Then every non-trainable weight
   is read: the state before the towers.
2. Tower 0 runs as one device does and makes its assignments. Every other
   tower reads that state before the towers (its replicas for the trainable
   variables, with ``replicate_variables=True``), and its assignments to the
   model's weights are dropped; the increments it makes to the model's
   metrics (updated in ``compute_loss``) are added to them, and its other
   assignments (the seed generators of random layers) are made. The
   model's weights end the step with tower 0's assignments: one device's for
   an update that does not depend on the batch (a counter, spectral
   normalisation) or that uses statistics of the global batch (synchronised
   `BatchNormalization`), and tower 0's own for an update from its shard
   alone (``sync_batch_norm=False``), as stock `MirroredStrategy` keeps its
   first replica's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

from kerastower import _keras_compat
from kerastower.step import checks


def spectral_normalizations(model: keras.Model) -> list:
    """The `keras.layers.SpectralNormalization` layers inside `model`."""
    return [
        layer
        for layer in _keras_compat.inner_layers(model)
        if isinstance(layer, keras.layers.SpectralNormalization)
    ]


def _own_updates(model: keras.Model) -> set[int]:
    """The weights whose tower-0 value is one device's by construction.

    `BatchNormalization`'s moving statistics (of the global batch when
    synchronised; tower 0's otherwise, as stock `MirroredStrategy` keeps its
    first replica's, as documented) and `SpectralNormalization`'s state.
    """
    layers = _keras_compat.inner_layers(model)
    kinds = (keras.layers.BatchNormalization, keras.layers.SpectralNormalization)
    owners = [layer for layer in layers if isinstance(layer, kinds)]
    return {id(v) for layer in owners for v in layer.weights}


@dataclasses.dataclass
class StepState:
    """What the towers of one training step share.

    Attributes:
        values: ``(variable, value)`` for each of the model's non-trainable
            weights, read before the towers ran.
        metrics: ``(variable, value)`` for each of its metrics' variables,
            read before the towers ran.
        assigned: The paths of trainable weights that a tower after the
            first assigned (a dict used as an ordered set).
        kept: The paths of non-trainable weights that a tower after the
            first assigned and that end the step with tower 0's value, where
            that may not be one device's (an ordered set).
    """

    values: list
    metrics: list = dataclasses.field(default_factory=list)
    assigned: dict = dataclasses.field(default_factory=dict)
    kept: dict = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def step_state(
    model: keras.Model, replicas: Any = None, training: bool = True
) -> Iterator[StepState]:
    """Runs the once-per-step updates and yields the state before the towers.

    Open it around the towers of a step.

    Args:
        model: The `kerastower.TowerModel`.
        replicas: The model's `kerastower.reduce.replicas.Replicas`, or ``None``.
        training: Whether the step trains (`SpectralNormalization` updates
            only then).

    Yields:
        The `StepState` for `tower_reads`. On exit, warns if a tower assigned
        a trainable weight that kerastower does not update once per step, or
        a non-trainable one that keeps tower 0's value.
    """
    layers = spectral_normalizations(model) if training else []
    trainable = {id(v): j for j, v in enumerate(model.trainable_weights)}
    for layer in layers:
        with tf.device(model.tower_devices[0]):
            vector_u, kernel = _keras_compat.spectral_update(layer)
        layer.vector_u.assign(vector_u)
        layer.kernel.assign(kernel)
        j = trainable.get(id(layer.kernel))
        if replicas is not None and replicas.built and j is not None:
            for tower in range(1, len(replicas.devices)):
                with tf.device(replicas.devices[tower]):
                    replicas.replica_variables(tower)[j].assign(kernel)
    weights = {id(v) for v in model.non_trainable_weights}
    state = StepState(
        [(v, tf.convert_to_tensor(v.value)) for v in model.non_trainable_weights],
        [
            (v, tf.convert_to_tensor(v.value))
            for v in model.metrics_variables
            if id(v) not in weights
        ],
    )
    try:
        for layer in layers:
            _keras_compat.freeze_spectral_update(layer)
        yield state
    finally:
        for layer in layers:
            _keras_compat.restore_spectral_update(layer)
    # Here, not in the towers, whose warnings `split_run` shows only once.
    if state.assigned:
        checks.warn_if_trainable_assigned(list(state.assigned))
    if state.kept:
        checks.warn_if_state_kept(list(state.kept))


@contextlib.contextmanager
def tower_reads(
    model: keras.Model,
    variables: Sequence[keras.Variable],
    state: StepState,
    replicas: Any = None,
    tower: int | None = None,
) -> Iterator[list]:
    """Makes a tower read the state before the towers while open.

    Open it inside the tower's `tf.GradientTape`, around its forward pass and
    loss; it yields the variables to differentiate. Tower 0 reads and
    assigns the model's variables (`variables` itself is yielded). Any other
    tower reads `state` for the non-trainable weights and, for the trainable
    ones, its replicas (``replicas.copies(variables, tower)`` of `variables`
    are yielded) or the model's variables (`variables`, yielded), through a
    `keras.StatelessScope`; when it closes, the tower's assignments to
    variables that are not the model's weights are made.

    Args:
        model: The `kerastower.TowerModel`.
        variables: The variables the tower differentiates.
        state: The `StepState` that `step_state` yielded.
        replicas: The model's `kerastower.reduce.replicas.Replicas`, or ``None``.
        tower: The tower; defaults to the current replica context's (0
            outside `tf.distribute.Strategy.run`).
    """
    if tower is None:
        context = tf.distribute.get_replica_context()
        tower = int(tf.get_static_value(context.replica_id_in_sync_group))
    if tower == 0:
        yield list(variables)
        return

    def reads(variables):
        if replicas is None:
            return list(variables)
        return replicas.copies(variables, tower)

    read = reads(variables)
    mapping = list(zip(variables, read))
    mapped = {id(v) for v in variables}
    others = [v for v in model.trainable_weights if id(v) not in mapped]
    mapping += list(zip(others, reads(others)))
    mapping += [
        (v, value) for v, value in state.values + state.metrics if id(v) not in mapped
    ]
    mapped.update(id(v) for v, _ in mapping)
    mapping = [
        (
            v,
            tf.convert_to_tensor(
                value.value if isinstance(value, keras.Variable) else value
            ),
        )
        for v, value in mapping
    ]
    scope = _keras_compat.RecordingScope(mapping)
    with scope:
        yield read
    frozen = {id(layer.kernel) for layer in spectral_normalizations(model)}
    trainable = {id(v) for v in model.trainable_weights} - frozen
    state.assigned.update((v.path, None) for v in scope.updated if id(v) in trainable)
    before = {id(v): value for v, value in state.values}
    metrics = {id(v): value for v, value in state.metrics}
    own = _own_updates(model)
    made = set()
    for variable in scope.updated:
        if id(variable) in made:
            continue
        made.add(id(variable))
        if id(variable) not in mapped:
            variable.assign(scope.get_current_value(variable))
        elif id(variable) in metrics:
            delta = scope.get_current_value(variable) - metrics[id(variable)]
            variable.assign_add(delta)
        elif id(variable) in before and variable.aggregation == "sum":
            delta = scope.get_current_value(variable) - before[id(variable)]
            variable.assign_add(delta)
        elif id(variable) in before and id(variable) not in own:
            if variable.aggregation != "only_first_replica":
                state.kept[variable.path] = None
