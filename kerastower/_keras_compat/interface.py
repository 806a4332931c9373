"""The TensorFlow backend's side of the fence, as one interface.

`kerastower._keras_compat` hands on these names where Keras runs on
TensorFlow: the installed Keras family's (`keras3/` or `keras2/`, chosen by
`family`), TensorFlow's step machinery (`tensorflow/`) and the modules for
either family beside them (see the package's docstring).
"""

import functools

from kerastower._functional_variants import (
    functional_variant as _functional_variant,
)
from kerastower._keras_compat.errors import (
    SUPPORTED_KERAS,
    SUPPORTED_TENSORFLOW,
    KerasCompatibilityError,
    _attribute,
    _fail,
)
from kerastower._keras_compat.family import (
    KERAS_FAMILY,
    is_keras_class,
    is_variable,
)
from kerastower._keras_compat.metrics import (
    scalar_means_weighted,
    weigh_scalar_means,
)
from kerastower._keras_compat.seeds import (
    GlobalSeeds,
    global_seeds,
)
from kerastower._keras_compat.step_functions import (
    warn_once,
    warnings_shown_at_build,
)
from kerastower._keras_compat.tensorflow.collectives import (
    check_prepared,
    prepare_collective_ops,
    runtime_started,
    strategy_made_after_start,
    strategy_num_workers,
)
from kerastower._keras_compat.tensorflow.grappler_once import (
    is_function_call,
    optimised_once,
    unseen,
)
from kerastower._keras_compat.tensorflow.tower_calls import (
    call_with_captures,
    calls_without_graph_optimizer,
    calls_without_shape_inference,
    keeps_functions_apart,
    kernel_passes,
    orders_calls_here,
    resource_barrier,
    run_independently,
    skip_reference_variable_check,
    tower_replica_context,
)
from kerastower._keras_compat.tensorflow.xla import (
    compiled_in_towers,
)

if KERAS_FAMILY >= 3:
    from kerastower._keras_compat.keras3 import callbacks as _callbacks
    from kerastower._keras_compat.keras3 import layers as _layers
    from kerastower._keras_compat.keras3 import losses as _losses
    from kerastower._keras_compat.keras3 import optimizers as _optimizers
    from kerastower._keras_compat.keras3 import trainer as _trainer
else:
    from kerastower._keras_compat.keras2 import callbacks as _callbacks
    from kerastower._keras_compat.keras2 import layers as _layers
    from kerastower._keras_compat.keras2 import losses as _losses
    from kerastower._keras_compat.keras2 import optimizers as _optimizers
    from kerastower._keras_compat.keras2 import trainer as _trainer

CheckpointHooks = _callbacks.CheckpointHooks
check_execution_steps = _callbacks.check_execution_steps
is_remote_path = _callbacks.is_remote_path
keras_files_hold_optimizer = _callbacks.keras_files_hold_optimizer
learning_rate_slot = _callbacks.learning_rate_slot
print_msg = _callbacks.print_msg
set_initial_epoch = _callbacks.set_initial_epoch
steps_per_execution = _callbacks.steps_per_execution

activity_penalties_summed = _layers.activity_penalties_summed
assigns_in_towers = _layers.assigns_in_towers
draws_per_traced_op = _layers.draws_per_traced_op
freeze_spectral_update = _layers.freeze_spectral_update
held_before_towers = _layers.held_before_towers
is_spectral_normalization = _layers.is_spectral_normalization
override_batch_norm_moments = _layers.override_batch_norm_moments
restore_batch_norm = _layers.restore_batch_norm
restore_spectral_update = _layers.restore_spectral_update
spectral_update = _layers.spectral_update
tower_assignments = _layers.tower_assignments
unfused_batch_norm = _layers.unfused_batch_norm

get_keras_mask = _losses.get_keras_mask
loss_divisor = _losses.loss_divisor
set_keras_mask = _losses.set_keras_mask

build_optimizer = _optimizers.build_optimizer
clone_optimizer = _optimizers.clone_optimizer
why_no_replicas = _optimizers.why_no_replicas

Functional = _trainer.Functional
TrainerHooks = _trainer.TrainerHooks
build_before_towers = _trainer.build_before_towers
build_metrics = _trainer.build_metrics
compiled_loss = _trainer.compiled_loss
compiled_losses_replaced = _trainer.compiled_losses_replaced
compute_loss = _trainer.compute_loss
forward = _trainer.forward
functional_init_arguments = _trainer.functional_init_arguments
graph_of = _trainer.graph_of
init_functional = _trainer.init_functional
inner_layers = _trainer.inner_layers
loss_metric_weight = _trainer.loss_metric_weight
loss_scale_variables = _trainer.loss_scale_variables
loss_scaler = _trainer.loss_scaler
metrics_made_in_first_step = _trainer.metrics_made_in_first_step
per_output_loss_metrics = _trainer.per_output_loss_metrics
register_alias = _trainer.register_alias
register_serializable = _trainer.register_serializable
track_compiled_loss = _trainer.track_compiled_loss
track_step_loss = _trainer.track_step_loss

functional_variant = functools.partial(
    _functional_variant, register_alias=register_alias
)

__all__ = [
    "CheckpointHooks",
    "Functional",
    "GlobalSeeds",
    "KERAS_FAMILY",
    "KerasCompatibilityError",
    "SUPPORTED_KERAS",
    "SUPPORTED_TENSORFLOW",
    "TrainerHooks",
    "_attribute",
    "_fail",
    "activity_penalties_summed",
    "assigns_in_towers",
    "build_before_towers",
    "build_metrics",
    "build_optimizer",
    "call_with_captures",
    "calls_without_graph_optimizer",
    "calls_without_shape_inference",
    "check_execution_steps",
    "check_prepared",
    "clone_optimizer",
    "compiled_in_towers",
    "compiled_loss",
    "compiled_losses_replaced",
    "compute_loss",
    "draws_per_traced_op",
    "forward",
    "freeze_spectral_update",
    "functional_init_arguments",
    "functional_variant",
    "get_keras_mask",
    "global_seeds",
    "graph_of",
    "held_before_towers",
    "init_functional",
    "inner_layers",
    "is_function_call",
    "is_keras_class",
    "is_remote_path",
    "is_spectral_normalization",
    "is_variable",
    "keeps_functions_apart",
    "kernel_passes",
    "keras_files_hold_optimizer",
    "learning_rate_slot",
    "loss_divisor",
    "loss_metric_weight",
    "loss_scale_variables",
    "loss_scaler",
    "metrics_made_in_first_step",
    "optimised_once",
    "orders_calls_here",
    "override_batch_norm_moments",
    "per_output_loss_metrics",
    "prepare_collective_ops",
    "print_msg",
    "register_alias",
    "register_serializable",
    "restore_batch_norm",
    "resource_barrier",
    "restore_spectral_update",
    "run_independently",
    "runtime_started",
    "scalar_means_weighted",
    "set_initial_epoch",
    "set_keras_mask",
    "skip_reference_variable_check",
    "spectral_update",
    "steps_per_execution",
    "strategy_made_after_start",
    "strategy_num_workers",
    "tower_assignments",
    "tower_replica_context",
    "track_compiled_loss",
    "track_step_loss",
    "unfused_batch_norm",
    "unseen",
    "warn_once",
    "warnings_shown_at_build",
    "weigh_scalar_means",
    "why_no_replicas",
]
