"""Keras 2 model and trainer internals that `TowerModel` hooks into.

The Keras 3 counterparts are in `kerastower._keras_compat.keras3.trainer`. Keras 2
computes the compiled loss in ``model.compiled_loss`` (a ``LossesContainer``),
which also updates the ``loss`` metric and, for several outputs, one loss
metric per output; it builds them, and a subclassed model's weights, the
first time it is called (`build_before_towers` does that before the towers).
"""

from __future__ import annotations

import contextlib
import warnings

import tensorflow as tf

from kerastower._keras_compat.errors import _attribute, _fail, check_callables
from kerastower._keras_compat.family import keras
from kerastower._keras_compat.keras2.internals import internal
from kerastower._keras_compat.step_functions import StepFunctionHooks

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "Functional",
    "TrainerHooks",
    "build_before_towers",
    "build_metrics",
    "compiled_loss",
    "compiled_losses_replaced",
    "compute_loss",
    "forward",
    "functional_init_arguments",
    "graph_of",
    "init_functional",
    "inner_layers",
    "loss_metric_weight",
    "loss_scale_variables",
    "loss_scaler",
    "metrics_made_in_first_step",
    "per_output_loss_metrics",
    "register_alias",
    "register_serializable",
    "track_compiled_loss",
    "track_step_loss",
]

_functional = internal(
    "engine.functional",
    "Functional",
    "get_network_config",
    "reconstruct_from_config",
    "connect_ancillary_layers",
)
_training = internal("engine.training", "is_functional_model_init_params")
_registration = internal(
    "saving.object_registration", "_GLOBAL_CUSTOM_NAMES", "_GLOBAL_CUSTOM_OBJECTS"
)
_serialization = internal("saving.legacy.serialization", "SharedObjectLoadingScope")

functional_init_arguments = _training.is_functional_model_init_params
# What a functional model's config holds besides its own arguments.
_GRAPH_KEYS = ("layers", "input_layers", "output_layers")


class Functional(_functional.Functional):
    """Keras 2's `Functional`, saving its graph whatever the constructor.

    Keras 2 writes a functional model's graph into its config only when its
    class's ``__init__`` takes exactly ``(inputs, outputs, name,
    trainable)``, and rebuilds it with just those: `TowerModel` takes more.
    Here the graph is always saved, and every other key of the config is
    passed back to the constructor.
    """

    def get_config(self):
        config = super().get_config()
        if not all(key in config for key in _GRAPH_KEYS):
            config = _functional.get_network_config(self, config=config)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        if not all(key in config for key in _GRAPH_KEYS):
            return super().from_config(config, custom_objects=custom_objects)
        with _serialization.SharedObjectLoadingScope():
            inputs, outputs, layers = _functional.reconstruct_from_config(
                config, custom_objects
            )
            arguments = {k: v for k, v in config.items() if k not in _GRAPH_KEYS}
            model = cls(inputs=inputs, outputs=outputs, **arguments)
            _functional.connect_ancillary_layers(model, layers)
        return model


def _registries() -> tuple[dict, dict]:
    names = _registration._GLOBAL_CUSTOM_NAMES
    objects = _registration._GLOBAL_CUSTOM_OBJECTS
    if not isinstance(names, dict) or not isinstance(objects, dict):
        raise _fail("saving.object_registration._GLOBAL_CUSTOM_NAMES", "changed")
    return names, objects


def register_serializable(package: str):
    """`keras.saving.register_keras_serializable` with `package`, and the
    class's bare name too: Keras 2.12's HDF5 and SavedModel files name a
    model by its class's ``__name__`` (``.keras`` is HDF5 there)."""
    register = keras.saving.register_keras_serializable(package=package)

    def decorator(cls: type) -> type:
        cls = register(cls)
        _registries()[1].setdefault(cls.__name__, cls)
        return cls

    return decorator


def register_alias(alias: type, cls: type) -> None:
    """Saves instances of `alias` under the name `cls` is registered with,
    and loads them under `alias`'s bare name too (`register_serializable`)."""
    names, objects = _registries()
    if cls in names:
        names[alias] = names[cls]
        objects.setdefault(alias.__name__, alias)


def init_functional(model, args, kwargs) -> None:
    """Runs Keras's initialiser of a functional model on `model`."""
    _functional.Functional.__init__(model, *args, **kwargs)


def graph_of(model):
    """The functional graph behind a functional or `Sequential` model: the
    model itself in Keras 2."""
    return model


def compute_loss(model, x, y, y_pred, sample_weight, training: bool):
    """``model.compute_loss``, which takes no `training` in Keras 2."""
    del training
    return model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)


def loss_scaler(optimizer):
    """What scales the loss before its gradient: the identity in Keras 2.

    Raises:
        ValueError: For a `LossScaleOptimizer`, whose gradients Keras 2's
            ``minimize`` unscales before ``apply_gradients``: not supported
            on towers yet.
    """
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        raise ValueError(
            "TowerModel does not support `LossScaleOptimizer` on Keras 2 yet; "
            "use it on Keras 3, or train in float32. Received: "
            f"optimizer={optimizer!r}"
        )
    return _identity


def loss_scale_variables(model) -> list:
    """None: `loss_scaler` scales nothing in Keras 2."""
    del model
    return []


def _identity(loss):
    return loss


def forward(model, x, training: bool):
    """Calls `model` on `x`; Keras 2 drops `training` for a `call` without it."""
    return model(x, training=training)


def _losses_container(model):
    return getattr(model, "compiled_loss", None)


def loss_tracker(model):
    """The `Mean` metric behind the ``loss`` Keras 2 reports."""
    container = _losses_container(model)
    if container is None:
        raise ValueError(
            "You must call `compile()` before using the model. Received: "
            f"model={model.name!r}"
        )
    return _attribute(container, "_total_loss_mean", "LossesContainer")


def inner_layers(model):
    """Every layer inside `model`, nested models and layers included."""
    return _attribute(model, "_flatten_layers", "Layer")(include_self=False)


def build_before_towers(model, x) -> None:
    """Builds `model`'s weights and its compiled losses before the towers run.

    Keras 2 builds a subclassed model's weights on its first call and its
    compiled losses (and their metrics) on their first call: inside the
    towers, where variables cannot be made. The model is traced once on
    `x` in a function that is never run, which makes its weights and gives
    the structure of its outputs for the losses.
    """
    container = _losses_container(model)
    # Without losses given to `compile`, Keras 2 reports no ``loss`` unless
    # a `compute_loss` of the user's calls the container: left unbuilt.
    unbuilt_losses = (
        container is not None
        and _attribute(container, "_user_losses", "LossesContainer") is not None
        and not _attribute(container, "_built", "LossesContainer")
    )
    if model.built and not unbuilt_losses:
        return
    outputs = _traced_outputs(model, x)
    if unbuilt_losses:
        container.build(outputs)


def _traced_outputs(model, x):
    """`model`'s outputs on `x`, traced in a function that never runs."""
    trace = tf.function(lambda x: forward(model, x, training=True), autograph=False)
    # The towers trace the model again and show its warnings then.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trace.get_concrete_function(x).structured_outputs


def build_metrics(model, data) -> None:
    """Makes `model`'s weights, compiled losses and compiled metrics from a
    batch `data`, as Keras 2's first training step on it would: to restore
    their state before that step (`kerastower.callbacks.BackupAndRestore`).
    """
    x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
    build_before_towers(model, x)
    container = getattr(model, "compiled_metrics", None)
    if y is None or container is None:
        return
    if not _attribute(container, "_built", "MetricsContainer"):
        container.build(_traced_outputs(model, x), y)


class _ContainerTotal:
    """Stands in for the compiled loss's ``loss`` metric in the towers, and
    records what each tower's compiled loss gave it."""

    def __init__(self):
        self.totals: dict = {}

    def update_state(self, value, sample_weight=None):
        del sample_weight
        self.totals[tf.distribute.get_replica_context()] = value


@contextlib.contextmanager
def compiled_losses_replaced(model, wrap, metric_stand_in):
    """Replaces each compiled loss ``l`` by ``wrap(l)`` and the per-output
    loss metrics by ``metric_stand_in()`` while open.

    Keras 2 updates its ``loss`` metric inside the compiled loss, with the
    compiled losses and regularization only (not what a `compute_loss` of
    the user's adds): each tower's value is recorded, and the step updates
    the metric once, with the global value (`track_compiled_loss`).

    Yields:
        ``(loss_weights, has_metrics, totals)``: the weights of the compiled
        losses Keras computes (1.0 where none was given), in order; whether
        it keeps per-output loss metrics (models with several outputs); and
        each tower's value of the ``loss`` metric, keyed by its replica
        context.
    """
    container = _losses_container(model)
    if container is None:
        yield [], False, None
        return
    total = _attribute(container, "_total_loss_mean", "LossesContainer")
    recorder = _ContainerTotal()
    container._total_loss_mean = recorder
    if not _attribute(container, "_built", "LossesContainer"):
        # No compiled loss (`build_before_towers`): a `compute_loss` may call
        # the container, which builds in the tower.
        try:
            yield [], False, recorder.totals
        finally:
            container._total_loss_mean = total
        return
    losses = list(_attribute(container, "_losses", "LossesContainer"))
    weights = list(_attribute(container, "_loss_weights", "LossesContainer"))
    metrics = list(_attribute(container, "_per_output_metrics", "LossesContainer"))
    container._losses = [None if loss is None else wrap(loss) for loss in losses]
    container._per_output_metrics = [
        None if metric is None else metric_stand_in() for metric in metrics
    ]
    try:
        yield (
            [
                1.0 if weight is None else weight
                for loss, weight in zip(losses, weights)
                if loss is not None
            ],
            any(metric is not None for metric in metrics),
            recorder.totals,
        )
    finally:
        container._losses = losses
        container._per_output_metrics = metrics
        container._total_loss_mean = total


def metrics_made_in_first_step() -> bool:
    """Whether `fit` makes a model's compiled metrics in its first step:
    Keras 2 does."""
    return True


def track_step_loss(model, loss, batch_size) -> None:
    """Nothing: Keras 2's ``loss`` metric is its compiled loss's
    (`track_compiled_loss`)."""
    del model, loss, batch_size


def track_compiled_loss(model, values: list, batch_size) -> list:
    """The per-output values of a step's compiled loss, whose last value,
    the whole compiled loss, updates the model's ``loss`` metric, weighted
    by `batch_size`."""
    if not values:
        return values
    *values, total = values
    loss_tracker(model).update_state(total, sample_weight=batch_size)
    return values


def compiled_loss(model) -> None:
    """Nothing to check for coupling the examples: Keras 2's steps are not
    checked (`kerastower.step.coupled_loss`)."""
    del model


def loss_metric_weight(outputs) -> tf.Tensor:
    """What Keras 2 weighs a step's loss by in its loss metrics: the batch
    size, ``tf.shape(y)[0]``."""
    return tf.shape(outputs)[0]


def per_output_loss_metrics(model) -> list:
    """Keras 2's per-output loss metrics (empty for one output)."""
    container = _losses_container(model)
    if container is None or not _attribute(container, "_built", "LossesContainer"):
        return []
    metrics = _attribute(container, "_per_output_metrics", "LossesContainer")
    return [metric for metric in metrics or [] if metric is not None]


class TrainerHooks(StepFunctionHooks):
    """Overrides of `keras.Model`'s (Keras 2) trainer hooks for `TowerModel`."""


# The `keras.Model` methods `TowerModel` overrides or calls, checked at import.
check_callables(
    keras.Model,
    (
        "make_train_function",
        "make_test_function",
        "make_predict_function",
        "compute_loss",
        "_flatten_layers",
    ),
    "keras.Model",
)
