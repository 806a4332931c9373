"""Keras layer internals: the updates of `SpectralNormalization` and
`BatchNormalization`, `StatelessScope`'s."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from kerastower._keras_compat.errors import KERAS_MINOR, _fail, check_method
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

# The layers whose training call assigns a normalised kernel.
SPECTRAL_NORMALIZATION = (keras.layers.SpectralNormalization,)


def is_spectral_normalization(layer) -> bool:
    """Whether `layer` is a `SpectralNormalization` whose training call
    assigns its normalised kernel."""
    return isinstance(layer, SPECTRAL_NORMALIZATION)


def unfused_batch_norm() -> dict:
    """`BatchNormalization`'s arguments for its unfused kernel: none, Keras 3
    has no fused one."""
    return {}


def draws_per_traced_op(layers) -> bool:
    """Whether one of `layers` draws random numbers from ops seeded at trace:
    never on Keras 3, whose layers draw from a `keras.random.SeedGenerator`
    state that each tower offsets."""
    del layers
    return False


def assigns_in_towers() -> bool:
    """Whether layers make their assignments inside a tower traced once:
    never on Keras 3, whose towers return them (`tower_assignments`)."""
    return False


def _check_spectral_normalization(layer) -> None:
    check_method(type(layer), "normalized_weights", ["self"], "SpectralNormalization")
    for name in ("kernel", "vector_u"):
        if not isinstance(getattr(layer, name, None), keras.Variable):
            raise _fail(f"SpectralNormalization.{name}", "is missing")


def spectral_update(layer) -> tuple:
    """The ``(vector_u, kernel)`` that one training call of `layer` assigns.

    `keras.layers.SpectralNormalization` runs, at every call with
    ``training=True``, a power iteration on its kernel and assigns
    ``vector_u`` and ``kernel / sigma`` before calling the wrapped layer;
    a kernel of zeros is kept as it is.

    Raises:
        KerasCompatibilityError: If the layer no longer updates through
            ``normalized_weights()``, ``kernel`` and ``vector_u``.
    """
    _check_spectral_normalization(layer)
    return keras.ops.cond(
        keras.ops.all(keras.ops.equal(layer.kernel.value, 0)),
        lambda: (layer.vector_u.value, layer.kernel.value),
        lambda: type(layer).normalized_weights(layer),
    )


def freeze_spectral_update(layer) -> None:
    """Makes `layer`'s training calls assign its current values; undo with
    `restore_spectral_update`."""
    _check_spectral_normalization(layer)
    layer.normalized_weights = lambda: (layer.vector_u.value, layer.kernel.value)


def restore_spectral_update(layer) -> None:
    """Undoes `freeze_spectral_update`."""
    vars(layer).pop("normalized_weights", None)


def override_batch_norm_moments(layer, moments) -> None:
    """Makes a `BatchNormalization` layer compute its batch statistics with
    ``moments(inputs, reduction_axes, mask)`` (``None``: its own); undo with
    `restore_batch_norm`.

    The towers after the first hold their updates of the moving statistics
    (`kerastower.step.layer_updates`).

    Raises:
        KerasCompatibilityError: If the layer no longer computes its
            statistics in ``_moments(inputs, mask)`` over ``_reduction_axes``.
    """
    if moments is None:
        return
    check_method(
        type(layer), "_moments", ["self", "inputs", "mask"], "BatchNormalization"
    )
    if not hasattr(layer, "_reduction_axes"):
        raise _fail("BatchNormalization._reduction_axes", "is missing")
    layer._moments = lambda inputs, mask: moments(inputs, layer._reduction_axes, mask)


def restore_batch_norm(layer) -> None:
    """Undoes `override_batch_norm_moments`."""
    vars(layer).pop("_moments", None)


def _check_stateless_scope() -> None:
    check_method(
        keras.StatelessScope, "add_update", ["self", "update"], "keras.StatelessScope"
    )


def held_before_towers(model) -> tuple[list, list, list]:
    """What a tower after the first reads as the state before the towers.

    Returns:
        The model's non-trainable weights; its metrics' other variables; the
        layers' seed-generator states (a `keras.random.SeedGenerator`'s
        ``(2,)`` integer state: neither a weight nor a metric's).
    """
    weights = list(model.non_trainable_weights)
    held = {id(v) for v in weights}
    metrics = [v for v in model.metrics_variables if id(v) not in held]
    known = {id(v) for v in model.weights + model.metrics_variables}
    seeds = [
        v
        for v in model.non_trainable_variables
        if id(v) not in known and tuple(v.shape) == (2,) and "int" in v.dtype
    ]
    return weights, metrics, seeds


@contextlib.contextmanager
def tower_assignments(
    mapping: Callable[[], list], guarded: Callable[[], list]
) -> Iterator[RecordingScope]:
    """Holds the assignments of a tower after the first, made in the block.

    Args:
        mapping: Returns ``(variable, value)`` pairs: what each variable
            reads in the block.
        guarded: Unused: Keras 3 holds every assignment, none is refused
            (Keras 2 lists those to these weights).

    Yields:
        The `RecordingScope` the block runs in: ``updated`` lists the
        variables assigned, ``get_current_value`` their values; ``refused``
        is empty.
    """
    del guarded
    with RecordingScope(mapping()) as scope:
        yield scope


class RecordingScope(keras.StatelessScope):
    """A `keras.StatelessScope` that also lists the variables assigned in it.

    Inside it, a Keras variable in `state_mapping` reads its mapped value, and
    every assignment is held by the scope instead of made (Keras passes each
    one to ``add_update((variable, value))``); `updated` lists the variables
    assigned, in order. Losses added by layers are collected by the scope, as
    `keras.Layer.stateless_call` does.

    Raises:
        KerasCompatibilityError: If Keras no longer passes assignments to
            ``StatelessScope.add_update(update)``.
    """

    def __init__(self, state_mapping):
        _check_stateless_scope()
        super().__init__(state_mapping, collect_losses=True, initialize_variables=False)
        self.updated: list = []
        self.refused: list = []

    def add_update(self, update):
        self.updated.append(update[0])
        super().add_update(update)


# Keras 3.14 divides an activity regularizer's penalty by the batch size (a
# batch mean); Keras 3.10 to 3.13 add it summed over the batch.
ACTIVITY_PENALTY_IS_MEAN = KERAS_MINOR >= (3, 14)


class _SummedPenalty:
    """An activity regularizer whose penalty counts as a sum over the batch.

    `TowerModel` weighs every added loss of tower ``i`` as a batch mean, by
    ``n_i / B``; a penalty summed over the shard's ``n_i`` examples is scaled
    by ``B / n_i`` so that the tower adds the shard's sum, and the towers
    add up to one device's sum over the batch.
    """

    def __init__(self, regularizer, global_batch):
        self.regularizer = regularizer
        self.global_batch = global_batch

    def __call__(self, output):
        penalty = self.regularizer(output)
        examples = keras.ops.cast(keras.ops.shape(output)[0], penalty.dtype)
        batch = keras.ops.cast(self.global_batch, penalty.dtype)
        return penalty * keras.ops.divide_no_nan(batch, examples)


@contextlib.contextmanager
def activity_penalties_summed(layers, global_batch) -> Iterator[None]:
    """Makes the towers add one device's activity penalty on Keras < 3.14.

    On Keras 3.14 and later the penalty is a batch mean and nothing changes.

    Args:
        layers: Every layer of the model.
        global_batch: ``B``, the step's examples on all towers and workers.
    """
    changed = []
    if not ACTIVITY_PENALTY_IS_MEAN:
        for layer in layers:
            regularizer = getattr(layer, "activity_regularizer", None)
            if regularizer is not None:
                layer.activity_regularizer = _SummedPenalty(regularizer, global_batch)
                changed.append((layer, regularizer))
    try:
        yield
    finally:
        for layer, regularizer in changed:
            layer.activity_regularizer = regularizer
