"""Keras trainer, model and layer internals that `TowerModel` hooks into."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import tensorflow as tf

from kerastower._keras_compat import keras3_functional
from kerastower._keras_compat.errors import _attribute, _fail, check_callables
from kerastower._keras_compat.family import keras
from kerastower._keras_compat.step_functions import StepFunctionHooks, warn_once

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


def register_serializable(package: str):
    """`keras.saving.register_keras_serializable` with `package`."""
    return keras.saving.register_keras_serializable(package=package)


_FUNCTIONAL = keras3_functional.load(_fail)
Functional = _FUNCTIONAL.functional
functional_init_arguments = _FUNCTIONAL.functional_init_arguments
init_functional = _FUNCTIONAL.init_functional
register_alias = _FUNCTIONAL.register_alias


def graph_of(model):
    """The functional graph behind a functional or `Sequential` model."""
    return getattr(model, "_functional", None) or model


def build_before_towers(model, x) -> None:
    """Nothing: Keras 3 builds before the first step (`_maybe_symbolic_build`)."""
    del model, x


def build_metrics(model, data) -> None:
    """Nothing: Keras 3 builds its metrics before `fit`'s first step."""
    del model, data


def compute_loss(model, x, y, y_pred, sample_weight, training: bool):
    """`model.compute_loss`, also for overrides without a `training` argument."""
    return _attribute(model, "_compute_loss", "Trainer")(
        x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
    )


def loss_scaler(optimizer):
    """What scales the loss before its gradient: ``optimizer.scale_loss``
    (the identity, or a `LossScaleOptimizer`'s scale)."""
    return optimizer.scale_loss


def loss_scale_variables(model) -> list:
    """The variables that `loss_scaler` of `model`'s optimizer reads: a
    built `keras.optimizers.LossScaleOptimizer`'s scale, or none (also for
    a model not compiled).

    Raises:
        KerasCompatibilityError: If the scale is no longer the variable
            ``dynamic_scale``.
    """
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return []
    if not optimizer.built:  # it scales by its initial scale, a number
        return []
    scale = getattr(optimizer, "dynamic_scale", None)
    if not isinstance(scale, keras.Variable):
        raise _fail("LossScaleOptimizer.dynamic_scale", "is not a variable")
    return [scale]


def forward(model, x, training: bool):
    """Calls `model` on `x`, passing `training` when its `call` takes it."""
    if _attribute(model, "_call_has_training_arg", "Layer"):
        return model(x, training=training)
    return model(x)


def loss_tracker(model):
    """The `Mean` metric behind the ``loss`` Keras reports."""
    return _attribute(model, "_loss_tracker", "Trainer")


def inner_layers(model):
    """Every layer inside `model`, nested models and layers included."""
    return _attribute(model, "_flatten_layers", "Layer")(include_self=False)


@contextlib.contextmanager
def compiled_losses_replaced(model, wrap, metric_stand_in):
    """Replaces each compiled loss ``l`` by ``wrap(l)`` and each per-output loss
    metric by ``metric_stand_in()`` while open.

    Yields:
        ``(loss_weights, has_metrics, None)``: the compiled losses' weights
        (1.0 where none was given), in the order Keras computes them, and
        whether Keras keeps per-output loss metrics (models with several
        outputs); Keras 3's ``loss`` metric is the step's whole loss.

    Raises:
        KerasCompatibilityError: If Keras no longer keeps its compiled losses
            and their metrics where this expects them.
    """
    compile_loss = _attribute(model, "_compile_loss", "Trainer")
    if compile_loss is None:
        yield [], False, None
        return
    entries = _attribute(compile_loss, "_flat_losses", "CompileLoss")
    metrics = _attribute(compile_loss, "_metrics", "CompileLoss")
    entries, metrics = list(entries or []), list(metrics or [])
    for entry in entries:
        if not {"loss", "loss_weights"} <= set(getattr(entry, "_fields", ())):
            raise _fail(
                "CompileLoss._flat_losses entries (loss, loss_weights)", "changed"
            )
    # Unbuilt (a model that could not be built before its first step): Keras
    # builds the losses as it traces, unwrapped, which is left alone.
    if entries:
        compile_loss._flat_losses = [e._replace(loss=wrap(e.loss)) for e in entries]
    if metrics:
        compile_loss._metrics = [metric_stand_in() for _ in metrics]
    try:
        yield (
            [1.0 if e.loss_weights is None else e.loss_weights for e in entries],
            bool(metrics),
            None,
        )
    finally:
        if entries:
            compile_loss._flat_losses = entries
        if metrics:
            compile_loss._metrics = metrics


def metrics_made_in_first_step() -> bool:
    """Whether `fit` makes a model's compiled metrics in its first step: no,
    Keras 3 builds them before."""
    return False


def track_step_loss(model, loss, batch_size) -> None:
    """Updates the model's ``loss`` metric with a step's whole loss,
    weighted by its batch size."""
    loss_tracker(model).update_state(loss, sample_weight=batch_size)


def track_compiled_loss(model, values: list, batch_size) -> list:
    """The per-output values of a step's compiled loss: `values` (the
    ``loss`` metric is the step's, `track_step_loss`)."""
    del model, batch_size
    return values


def compiled_loss(model):
    """The compiled losses that the first step checks for coupling the
    examples (`kerastower.step.coupled_loss`)."""
    return getattr(model, "loss", None)


def loss_metric_weight(outputs) -> int | None:
    """What Keras weighs a step's per-output loss by in its metric: the
    static batch size of the predictions (``None`` when unknown: 1)."""
    return outputs.shape[0]


def per_output_loss_metrics(model) -> list:
    """Keras's per-output loss metrics (empty for one output)."""
    compile_loss = _attribute(model, "_compile_loss", "Trainer")
    if compile_loss is None:
        return []
    return list(_attribute(compile_loss, "_metrics", "CompileLoss") or [])


def _batch_spec(iterator):
    """The specs of a batch of Keras's TensorFlow epoch iterator, without
    drawing one: the ``element_spec`` of the dataset the epoch reads (each
    batch's structure, shapes and dtypes, all `_symbolic_build` reads of a
    batch)."""
    dataset = _attribute(iterator, "_distributed_dataset", "TFEpochIterator")
    return _attribute(dataset, "element_spec", "TFEpochIterator._distributed_dataset")


def _build_compiled_from_graph(model, data_batch) -> None:
    """Builds a built functional `model`'s compiled loss and metrics from
    the output specs of its graph, where its inputs have the batch's shapes.

    Keras's `_symbolic_build` learns the outputs' specs by calling the model
    in a scratch graph (ResNet50: 1,800 ops, half a second of the first
    step); a functional model has them (`Functional.compute_output_spec`,
    which takes that shortcut itself). Then `_symbolic_build` finds them
    built and calls nothing. The batch size is left unknown, as for any
    dataset whose last batch may be short; other models build as Keras
    builds them.
    """
    layers = _attribute(model, "_flatten_layers", "Layer")()
    if not isinstance(model, Functional) or not all(layer.built for layer in layers):
        return
    symbolic = tf.nest.map_structure(_any_batch, data_batch)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(symbolic)
    leaves = tf.nest.flatten(x)
    if any(leaf is None for leaf in leaves):  # an optional input left out
        return
    if [leaf.shape for leaf in leaves] != [tuple(t.shape) for t in model.inputs]:
        return
    y_pred = model.compute_output_spec(x, training=False)
    metrics = _attribute(model, "_compile_metrics", "Trainer")
    if metrics is not None and not metrics.built:
        _compute_output_spec()(
            model.compute_metrics, x, y, y_pred, sample_weight=sample_weight
        )
    loss = _attribute(model, "_compile_loss", "Trainer")
    if loss is not None and not loss.built:
        _compute_output_spec()(
            _attribute(model, "_compute_loss", "Trainer"),
            x,
            y,
            y_pred,
            sample_weight=sample_weight,
            training=False,
        )


def _any_batch(spec):
    """A `keras.KerasTensor` of `spec`'s shape, its batch size unknown."""
    if spec is None:
        return None
    shape = tuple(spec.shape)
    return keras.KerasTensor(
        shape[:1] and (None, *shape[1:]), keras.backend.standardize_dtype(spec.dtype)
    )


def _compute_output_spec():
    """Keras's `keras.src.backend.compute_output_spec`: a function's output
    specs, from a call in a scratch graph."""
    try:
        from keras.src import backend
    except ImportError as error:
        raise _fail("keras.src.backend", "cannot be imported") from error
    return _attribute(backend, "compute_output_spec", "keras.src.backend")


_OPTIONAL = (tf.experimental.Optional, tf.OptionalSpec)


def _none_if_optional(leaf):
    """``None`` for an optional input or the spec of a ``None`` one (which
    has no shape), else `leaf`."""
    if isinstance(leaf, _OPTIONAL) or not hasattr(leaf, "shape"):
        return None
    return leaf


class TrainerHooks(StepFunctionHooks):
    """Overrides of private `keras.Model` trainer hooks for `TowerModel`.

    The decisions stay with the model: ``num_towers`` and
    ``_builds_before_towers()`` say whether its steps run on several towers
    or workers.
    """

    # What the model that mixes this in provides (`TowerModel`).
    _builds_before_towers: Callable[[], bool]
    _tower_train_step: Callable

    def _resolve_auto_jit_compile(self):
        if self.num_towers > 1:
            return False  # as Keras does under tf.distribute
        return super()._resolve_auto_jit_compile()

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is not None or not self._builds_before_towers():
            return super()._maybe_symbolic_build(iterator, data_batch)
        # Keras defers building loss and metric state to the first trace,
        # which for towers would happen inside the tower strategy. The build
        # calls the model once more than one device does: the step's trace
        # does not repeat the warnings shown here (`warn_once`). It builds
        # from the batches' specs, not from a batch: drawing one would start
        # a `PyDataset`'s workers, or consume a shuffle, one device does not.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if data_batch is None:
                    data_batch = _batch_spec(iterator)
                # Keras's step turns optional inputs (`None` from a generator)
                # back into `None`; the build must see them so too.
                data_batch = tf.nest.map_structure(_none_if_optional, data_batch)
                _build_compiled_from_graph(self, data_batch)
                self._symbolic_build(data_batch=data_batch)
            except StopIteration:
                pass  # no data: Keras warns that the input ran out, as one device
            except RuntimeError as error:
                # "Unable to automatically build": a model with its own
                # `train_step` and no `call` (a GAN, a VAE) builds in its step.
                if type(self).train_step is self._tower_train_step:
                    # Bad inputs: Keras 3.11 and newer raise the ValueError
                    # itself, as one device does; 3.10 wraps it.
                    cause = error.__context__
                    if isinstance(cause, ValueError):
                        raise cause from None
                    raise
        self._shown_warnings = warn_once(caught)


# The `keras.Model` methods `TowerModel` overrides or calls, checked at import.
check_callables(
    keras.Model,
    (
        "_maybe_symbolic_build",
        "_symbolic_build",
        "_resolve_auto_jit_compile",
        "make_train_function",
        "make_test_function",
        "make_predict_function",
        "_compute_loss",
        "_flatten_layers",
    ),
    "keras.Model",
)
