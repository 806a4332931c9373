"""Keras 2 layer state in towers: what a tower's forward pass assigns.

Keras 3 runs the towers after the first inside a `keras.StatelessScope`
that holds their assignments (`kerastower._keras_compat.keras3.layers`). Keras 2
layers assign TensorFlow variables directly and have no such scope: here a
tower reads and assigns the model's variables as they are, so only models
whose forward pass assigns no weight train exactly on towers. Keras 2's
`BatchNormalization` runs unfused with global moments (below);
`SpectralNormalization` (`tf_keras` 2.19 and newer; that of Keras 2.13 to
`tf_keras` 2.18 cannot be traced, on one device either) updates once per step, as on
Keras 3, through ``normalize_weights()``. An activity regularizer's penalty is
already a batch mean in Keras 2 (``Layer._handle_activity_regularization``
divides it by the batch size).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import tensorflow as tf

from kerastower._keras_compat.errors import (
    _attribute,
    _fail,
    _fail_tensorflow,
    check_method,
)
from kerastower._keras_compat.family import keras

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "activity_penalties_summed",
    "draws_per_traced_op",
    "freeze_spectral_update",
    "held_before_towers",
    "is_spectral_normalization",
    "override_batch_norm_moments",
    "restore_batch_norm",
    "restore_spectral_update",
    "spectral_update",
    "tower_assignments",
    "unfused_batch_norm",
]

# `tf_keras` 2.19 and newer, whose `SpectralNormalization` returns the new
# values from ``normalize_weights()`` (and ``_update_weights()`` assigns
# them). Keras 2.12 has none; that of Keras 2.13 to `tf_keras` 2.18 assigns
# inside ``normalize_weights()``, in a Python `if` on a tensor that no trace
# takes: a `fit` fails on it, on one device too, before the towers.
_SPECTRAL = getattr(keras.layers, "SpectralNormalization", None)
SPECTRAL_NORMALIZATION: tuple = (
    (_SPECTRAL,) if callable(getattr(_SPECTRAL, "_update_weights", None)) else ()
)


def is_spectral_normalization(layer) -> bool:
    """Whether `layer` is a `SpectralNormalization` whose training call
    assigns its normalised kernel (see `SPECTRAL_NORMALIZATION`)."""
    return isinstance(layer, SPECTRAL_NORMALIZATION)


def unfused_batch_norm() -> dict:
    """`BatchNormalization`'s arguments for its unfused kernel."""
    return {"fused": False}


def held_before_towers(model) -> tuple[list, list, list]:
    """Nothing: Keras 2 has no scope that holds a tower's assignments (Keras
    3's `StatelessScope`), every tower reads and assigns the model's
    variables (`tower_assignments`)."""
    del model
    return [], [], []


class _Assignments:
    """A Keras 2 tower's assignments: none held (``updated``); those to the
    guarded weights, listed in ``refused``."""

    def __init__(self, refused: list):
        self.updated: list = []
        self.refused = refused

    def get_current_value(self, variable):
        raise ValueError(f"Keras 2 holds no assignment. Received: {variable!r}")


@contextlib.contextmanager
def tower_assignments(
    mapping: Callable[[], list], guarded: Callable[[], list]
) -> Iterator[_Assignments]:
    """Lists the assignments of a tower after the first to guarded weights.

    Keras 2 cannot hold them: the tower reads and assigns the model's
    variables, and its assignments to the weights `guarded` returns are
    listed (`assignments_to`) for the caller to refuse.

    Args:
        mapping: Unused: the tower reads the model's variables.
        guarded: Returns the weights a tower after the first must not assign.

    Yields:
        Its ``refused`` lists, once the block exits, the guarded weights the
        block assigned; ``updated`` is empty.
    """
    del mapping
    with assignments_to(guarded()) as assigned:
        held = _Assignments(assigned)
        yield held


@contextlib.contextmanager
def activity_penalties_summed(layers, global_batch) -> Iterator[None]:
    """Nothing to change: Keras 2's activity penalty is a batch mean."""
    del layers, global_batch
    yield


# The ops by which a traced function assigns a resource variable.
_ASSIGNING_OPS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _outermost(tensor, maps: dict):
    """What `tensor` of a traced function was captured from: follows the
    captures out through the enclosing functions to the eager tensor.

    `maps` caches each graph's capture map (inner tensor to outer one)."""
    while getattr(tensor.graph, "captures", None) is not None:
        graph = tensor.graph
        if graph not in maps:
            maps[graph] = {id(inner): outer for outer, inner in graph.captures}
        if id(tensor) not in maps[graph]:
            return tensor
        tensor = maps[graph][id(tensor)]
        if not hasattr(tensor, "graph"):  # an eager tensor: a variable's handle
            return tensor
    return tensor


@contextlib.contextmanager
def assignments_to(variables) -> Iterator[list]:
    """Lists the `variables` that the ops traced in the block assign.

    Keras 2 holds no tower's assignments (`tower_assignments`): a tower
    after the first that assigns one of the model's weights makes the
    assignment again. The ops the block adds to the function being traced are
    read for assignments (``AssignVariableOp``, its add and sub forms and the
    ``ResourceScatter`` ops) to a variable among `variables` (any of its
    copies, for a distributed variable); an assignment inside a nested
    function (a `tf.cond` branch) or a block run eagerly is not seen.

    Yields:
        A list, filled when the block exits with the variables assigned, in
        the order of `variables`.
    """
    found: list = []
    if tf.executing_eagerly():
        yield found
        return
    graph = tf.compat.v1.get_default_graph()
    # A list of ``(outer, inner)`` pairs (TensorFlow 2.12: a dict's values).
    if not hasattr(getattr(graph, "captures", None), "__iter__"):
        raise _fail_tensorflow("FuncGraph.captures", "is missing or changed")
    start = len(graph.get_operations())
    yield found
    assigned, maps = set(), {}
    for op in graph.get_operations()[start:]:
        if op.type in _ASSIGNING_OPS or op.type.startswith("ResourceScatter"):
            assigned.add(id(_outermost(op.inputs[0], maps)))
    for variable in variables:
        copies = getattr(variable, "values", None) or (variable,)
        if any(id(copy.handle) in assigned for copy in copies):
            found.append(variable)


def draws_per_traced_op(layers) -> bool:
    """Whether one of `layers` draws random numbers from ops seeded at trace.

    Keras 2's random layers (``BaseRandomLayer``: `Dropout`, the noise and
    augmentation layers) draw through stateful TensorFlow ops whose seed is
    fixed when they are traced: towers that call one traced function would
    all draw tower 0's numbers (the same dropout mask on every tower), so
    such a model traces one copy per tower.
    """
    return any(hasattr(layer, "_random_generator") for layer in layers)


def assigns_in_towers() -> bool:
    """Whether layers make their assignments inside a tower traced once:
    on Keras 2, `BatchNormalization`'s moving statistics are assigned there,
    by the tower whose replica id is 0."""
    return True


def _check_spectral_normalization(layer) -> None:
    check_method(type(layer), "normalize_weights", ["self"], "SpectralNormalization")
    for name in ("kernel", "vector_u"):
        if not isinstance(getattr(layer, name, None), tf.Variable):
            raise _fail(f"SpectralNormalization.{name}", "is missing")


def spectral_update(layer) -> tuple:
    """The ``(vector_u, kernel)`` that one training call of `layer` assigns.

    `tf_keras`'s `SpectralNormalization` (2.19 and newer) runs, at every
    call with ``training=True``, a power iteration (``normalize_weights()``,
    which returns ``(kernel / sigma, vector_u)``) and assigns both before
    calling the wrapped layer; a kernel of zeros is kept as it is.
    """
    _check_spectral_normalization(layer)
    kernel, vector_u = tf.cond(
        tf.reduce_all(tf.equal(layer.kernel, 0)),
        lambda: (tf.identity(layer.kernel), tf.identity(layer.vector_u)),
        lambda: type(layer).normalize_weights(layer),
    )
    return vector_u, kernel


def freeze_spectral_update(layer) -> None:
    """Makes `layer`'s training calls assign its current values; undo with
    `restore_spectral_update`."""
    _check_spectral_normalization(layer)
    layer.normalize_weights = lambda: (
        tf.identity(layer.kernel),
        tf.identity(layer.vector_u),
    )


def restore_spectral_update(layer) -> None:
    """Undoes `freeze_spectral_update`."""
    vars(layer).pop("normalize_weights", None)


# The `BatchNormalization` methods the towers replace, and their parameters.
_BATCH_NORM_HOOKS = {
    "_calculate_mean_and_var": [
        "self",
        "inputs",
        "reduction_axes",
        "keep_dims",
        "mask",
    ],
    "_assign_moving_average": ["self", "variable", "value", "momentum", "inputs_size"],
}
_FUSED: dict[int, object] = {}  # each overridden layer's own ``fused``


def _check_batch_norm(layer) -> None:
    for name, parameters in _BATCH_NORM_HOOKS.items():
        check_method(type(layer), name, parameters, "BatchNormalization")
    if getattr(layer, "renorm", False) or layer.virtual_batch_size is not None:
        raise ValueError(
            "TowerModel does not split a Keras 2 `BatchNormalization` with "
            "`renorm=True` or a `virtual_batch_size` over towers. Received: "
            f"layer={layer.name!r}"
        )


def override_batch_norm_moments(layer, moments) -> None:
    """Makes a Keras 2 `BatchNormalization` layer compute its batch
    statistics with ``moments(inputs, reduction_axes, mask, with_count=True)``
    (``None``: its own) and update its moving statistics on the first tower
    only; undo with `restore_batch_norm`.

    The layer runs its unfused implementation meanwhile: the fused kernel
    computes the statistics itself. Both normalise with the biased variance;
    a fused layer updates its moving variance with the unbiased one,
    ``variance * n / (n - 1)`` (Keras 2 leaves the kernel's Bessel
    correction in, ``_bessels_correction_test_only``), which is applied here
    with the count ``n`` of the statistics. Only tower 0 updates the moving
    statistics (the others' update is 0): with the global batch's statistics
    that is one device's update, and without them tower 0's own, as stock
    `MirroredStrategy` keeps its first replica's.

    Raises:
        KerasCompatibilityError: If the layer no longer computes its
            statistics in ``_calculate_mean_and_var`` or updates them in
            ``_assign_moving_average``.
        ValueError: For batch renormalisation or a virtual batch size.
    """
    _check_batch_norm(layer)
    unbiased = bool(layer.fused) and _attribute(
        layer, "_bessels_correction_test_only", "BatchNormalization"
    )
    _FUSED[id(layer)] = layer.fused
    layer.fused = False
    own = type(layer)._calculate_mean_and_var
    assign = type(layer)._assign_moving_average
    counts: list = []

    def calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=None):
        if moments is None:
            mean, variance = own(layer, inputs, reduction_axes, keep_dims, mask)
            shape = tf.shape(inputs)
            count = tf.reduce_prod(tf.gather(shape, list(reduction_axes)))
            counts[:] = [tf.cast(count, variance.dtype)]
            return mean, variance
        mean, variance, count = moments(inputs, reduction_axes, mask, with_count=True)
        counts[:] = [count]
        if keep_dims:
            for axis in sorted(reduction_axes):
                mean = tf.expand_dims(mean, axis)
                variance = tf.expand_dims(variance, axis)
        return mean, variance

    def first_tower_updates(variable, value, momentum, inputs_size):
        context = tf.distribute.get_replica_context()
        first = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.int32)
        if inputs_size is not None:
            first *= tf.cast(inputs_size, tf.int32)
        if unbiased and variable is layer.moving_variance:
            n = tf.cast(counts[-1], value.dtype)
            value = value * tf.where(n > 1, n / (n - 1), tf.ones_like(n))
        return assign(layer, variable, value, momentum, first)

    layer._calculate_mean_and_var = calculate_mean_and_var
    layer._assign_moving_average = first_tower_updates


def restore_batch_norm(layer) -> None:
    """Undoes `override_batch_norm_moments`."""
    for name in _BATCH_NORM_HOOKS:
        vars(layer).pop(name, None)
    if id(layer) in _FUSED:
        layer.fused = _FUSED.pop(id(layer))
