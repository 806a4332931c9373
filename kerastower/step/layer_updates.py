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
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat import family
from kerastower._keras_compat.family import keras
from kerastower.step import checks


def spectral_normalizations(model: keras.Model) -> list:
    """The `keras.layers.SpectralNormalization` layers inside `model`."""
    return [
        layer
        for layer in _keras_compat.inner_layers(model)
        if _keras_compat.is_spectral_normalization(layer)
    ]


def _own_updates(model: keras.Model) -> set[int]:
    """The weights whose tower-0 value is one device's by construction.

    `BatchNormalization`'s moving statistics (of the global batch when
    synchronised; tower 0's otherwise, as stock `MirroredStrategy` keeps its
    first replica's, as documented) and `SpectralNormalization`'s state.
    """
    layers = _keras_compat.inner_layers(model)
    owners = [
        layer
        for layer in layers
        if isinstance(layer, keras.layers.BatchNormalization)
        or _keras_compat.is_spectral_normalization(layer)
    ]
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
        seeds: The layers' seed-generator states and Keras's global one's
            (see `_seed_states`).
        scales: A loss-scale optimizer's scale, or nothing
            (`kerastower._keras_compat.loss_scale_variables`).
        global_seeds: Keras's global seed generator, for the towers'
            threads (`kerastower._keras_compat.GlobalSeeds`).
        traced: ``(variables, values)`` that a tower traced once assigned,
            for `apply_traced`.
    """

    values: list
    metrics: list = dataclasses.field(default_factory=list)
    assigned: dict = dataclasses.field(default_factory=dict)
    kept: dict = dataclasses.field(default_factory=dict)
    seeds: list = dataclasses.field(default_factory=list)
    scales: list = dataclasses.field(default_factory=list)
    traced: list = dataclasses.field(default_factory=list)
    global_seeds: Any = dataclasses.field(default_factory=_keras_compat.GlobalSeeds)


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
    with _keras_compat.global_seeds() as global_seeds:
        with _states(model, layers, global_seeds) as state:
            yield state
    # Here, not in the towers, whose warnings `split_run` shows only once.
    if state.assigned:
        checks.warn_if_trainable_assigned(list(state.assigned))
    if state.kept:
        checks.warn_if_state_kept(list(state.kept))


@contextlib.contextmanager
def _states(model, layers, global_seeds) -> Iterator[StepState]:
    weights, metrics, seeds = _keras_compat.held_before_towers(model)
    state = StepState(
        [(v, family.value_of(v)) for v in weights],
        [(v, family.value_of(v)) for v in metrics],
        seeds=seeds + global_seeds.variables,
        scales=_keras_compat.loss_scale_variables(model),
        global_seeds=global_seeds,
    )
    try:
        for layer in layers:
            _keras_compat.freeze_spectral_update(layer)
        yield state
    finally:
        for layer in layers:
            _keras_compat.restore_spectral_update(layer)


@contextlib.contextmanager
def tower_reads(
    model: keras.Model,
    variables: Sequence[keras.Variable],
    state: StepState,
    replicas: Any = None,
    tower: int | None = None,
    given_values: dict | None = None,
) -> Iterator[list]:
    """Makes a tower read the state before the towers while open.

    Open it inside the tower's `tf.GradientTape`, around its forward pass and
    loss; it yields the variables to differentiate. Tower 0 reads and
    assigns the model's variables (`variables` itself is yielded). Any other
    tower reads `state` for the non-trainable weights and, for the trainable
    ones, its replicas (``replicas.copies(variables, tower)`` of `variables`
    are yielded) or the model's variables (`variables`, yielded), through a
    `keras.StatelessScope`; when it closes, the tower's assignments to
    variables that are not the model's weights are made. On Keras 2, which
    has no such scope, a tower after the first that assigns one of the
    model's weights (other than those kerastower updates once per step) is
    refused (`checks.refuse_assigned_weights`). Keras's global seed
    generator is the step's (`StepState.global_seeds`) while open.

    Args:
        model: The `kerastower.TowerModel`.
        variables: The variables the tower differentiates.
        state: The `StepState` that `step_state` yielded.
        replicas: The model's `kerastower.reduce.replicas.Replicas`, or ``None``.
        tower: The tower; defaults to the current replica context's (0
            outside `tf.distribute.Strategy.run`).
        given_values: For a tower traced once, the calling tower's value
            of each trainable variable (its replica's, with replicas), by
            ``id`` of the model's variable: read from the traced function's
            inputs, as are the seed states and a loss-scale optimizer's
            scale. A variable missing from it is read as it is.
    """
    with state.global_seeds.in_tower():
        with _reads(model, variables, state, replicas, tower, given_values) as read:
            yield read


@contextlib.contextmanager
def _reads(model, variables, state, replicas, tower, given_values) -> Iterator[list]:
    traced = None
    if tower is None:
        context = tf.distribute.get_replica_context()
        tower = tf.get_static_value(context.replica_id_in_sync_group)
        if tower is None:  # a tower traced once, for every tower
            traced = context.replica_id_in_sync_group
        else:
            tower = int(tower)
    if tower == 0:
        yield list(variables)
        return
    if traced is not None and replicas is not None and given_values is None:
        raise RuntimeError("A tower traced once with replicas needs their values.")

    def reads(variables):
        if traced is not None and given_values is not None:
            return [given_values.get(id(v), v) for v in variables]
        if replicas is None:
            return list(variables)
        return replicas.copies(variables, tower)

    read = reads(variables)
    given = {id(v) for v in variables}

    def mapping() -> list:
        pairs = list(zip(variables, read))
        others = [v for v in model.trainable_weights if id(v) not in given]
        pairs += list(zip(others, reads(others)))
        pairs += [
            (v, value)
            for v, value in state.values + state.metrics
            if id(v) not in given
        ]
        pairs += _seed_states(
            state, traced if traced is not None else tower, given_values or {}
        )
        if traced is not None:  # read once by the step, as the weights
            pairs += list(zip(state.scales, reads(state.scales)))
        return [(v, family.value_of(value)) for v, value in pairs]

    guarded = functools.partial(_guarded_weights, model)
    with _keras_compat.tower_assignments(mapping, guarded) as scope:
        yield read
    if scope.refused:
        checks.refuse_assigned_weights(model, [v.name for v in scope.refused])
    updated = list({id(v): v for v in scope.updated}.values())
    if traced is not None:
        state.traced.append((updated, [scope.get_current_value(v) for v in updated]))
        return
    mapped = given | _mapped(model, state)
    _make_updates(model, state, updated, scope.get_current_value, mapped, first=False)


def _mapped(model, state: StepState) -> set[int]:
    """The variables a tower after the first reads through the mapping of
    `tower_reads` (besides those it differentiates): the model's trainable
    weights, the state before the towers and the seed states, by ``id``."""
    mapped = {id(v) for v in model.trainable_weights}
    mapped.update(id(v) for v, _ in state.values + state.metrics)
    mapped.update(id(v) for v in state.seeds)
    return mapped


def _seed_states(state: StepState, tower, given: dict) -> list:
    """Each seed generator's state, moved to a stream of `tower`'s own.

    Tower ``i`` draws from the state ``(s_0 + i, s_1)``: tower 0 draws what
    one device draws, the others their own numbers, and the generator
    advances once per step, as on one device (tower 0's assignment). A
    state's value in `given` (by ``id`` of its variable) is used as it is,
    unread.
    """
    mapping = []
    for v in state.seeds:
        value = tf.convert_to_tensor(given.get(id(v), v))
        offset = tf.cast(tf.stack([tower, 0]), value.dtype)
        mapping.append((v, value + offset))
    return mapping


def _guarded_weights(model) -> list:
    """The weights that a tower after the first must not assign where its
    assignments cannot be held (Keras 2): all but those updated once per
    step (`_own_updates`) and its metrics' (summed over the towers,
    `kerastower._keras_compat.scalar_means_weighted`; Keras 2 lists a metric
    the model holds, a `Mean` that `compute_loss` updates, in `weights`)."""
    own = _own_updates(model)
    metrics = [m for m in model.metrics if isinstance(m, keras.metrics.Metric)]
    own.update(id(v) for metric in metrics for v in metric.variables)
    return [v for v in model.weights if id(v) not in own]


def apply_traced(
    model: keras.Model, state: StepState, per_tower: Sequence, first_tower: int = 0
) -> None:
    """Makes the assignments of a tower traced once, as towers traced one by
    one made them: tower 0's as they are, then the other towers' (see
    `tower_reads`).

    Args:
        model: The `kerastower.TowerModel`.
        state: The `StepState` the towers read; its ``traced`` lists the
            variables the traced tower assigned.
        per_tower: Each tower's values of those variables, in tower order.
        first_tower: The tower whose values come first in `per_tower`.
    """
    if not state.traced:
        return
    (updated, _) = state.traced[-1]
    mapped = _mapped(model, state)
    for tower, values in enumerate(per_tower, start=first_tower):
        value_of = dict(zip(map(id, updated), values))
        _make_updates(
            model,
            state,
            updated,
            lambda v, value_of=value_of: value_of[id(v)],
            mapped,
            first=tower == 0,
        )


def traced_values(state: StepState) -> list:
    """The values a tower traced once assigned, for `apply_traced`."""
    return list(state.traced[-1][1]) if state.traced else []


def _make_updates(model, state, updated, value_of, mapped, first: bool) -> None:
    """Makes one tower's assignments: all of tower 0's (`first`); of another
    tower, its metrics' and ``"sum"`` weights' increments and its assignments
    to variables that are not the model's weights."""
    if first:
        for variable in updated:
            variable.assign(value_of(variable))
        return
    frozen = {id(layer.kernel) for layer in spectral_normalizations(model)}
    trainable = {id(v) for v in model.trainable_weights} - frozen
    state.assigned.update((v.path, None) for v in updated if id(v) in trainable)
    before = {id(v): value for v, value in state.values}
    metrics = {id(v): value for v, value in state.metrics}
    own = _own_updates(model)
    for variable in updated:
        if id(variable) not in mapped:
            variable.assign(value_of(variable))
        elif id(variable) in metrics:
            delta = value_of(variable) - metrics[id(variable)]
            variable.assign_add(delta)
        elif id(variable) in before and variable.aggregation == "sum":
            delta = value_of(variable) - before[id(variable)]
            variable.assign_add(delta)
        elif id(variable) in before and id(variable) not in own:
            if variable.aggregation != "only_first_replica":
                state.kept[variable.path] = None
