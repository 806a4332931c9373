"""The private Keras hooks kerastower relies on, each checked against Keras.

Public Keras API is used wherever one exists. What has none (a loss's
per-element values and mask, Keras's masking of sample weights) is reached
here and nowhere else (so is TensorFlow's collective-ops start-up), and each
hook is checked once against the installed Keras: when Keras changes one, the
user gets an error that names the hook and the Keras version, never a silently
different model.

The package is that one place. `family` says which Keras is in use (Keras 3,
or Keras 2: `tf.keras` on TensorFlow 2.12 to 2.15, `tf_keras` after), and
this module exports that family's hooks under one set of names.

For either family: `errors` (the error and the supported ranges),
`step_functions` (Keras's ``make_*_function``), the functional variants
(`kerastower._functional_variants`, plain Python),
`metrics` (a `Mean` of a batch scalar updated in a tower), `seeds` (Keras's
global seed generator in the towers' threads), `xla` (XLA per
tower), `collectives` (TensorFlow's multi-worker start-up) and `tower_calls`
(one traced tower function called on every device).

Keras 3: `losses` (loss reduction and masks), `trainer` (model and trainer
hooks), `layers` (`SpectralNormalization`'s update, `StatelessScope`),
`callbacks` (callbacks, optimizers) and `optimizers` (an optimizer's copy
for replicas). Keras 2: their counterparts in `keras2`.
"""

import functools

from kerastower._functional_variants import (
    functional_variant as _functional_variant,
)
from kerastower._keras_compat.collectives import (
    call_time_value,
    check_prepared,
    prepare_collective_ops,
    runtime_started,
    strategy_made_after_start,
    strategy_num_workers,
)
from kerastower._keras_compat.errors import (
    SUPPORTED_KERAS,
    SUPPORTED_TENSORFLOW,
    KerasCompatibilityError,
    _attribute,
    _fail,
)
from kerastower._keras_compat.family import KERAS_FAMILY
from kerastower._keras_compat.metrics import (
    scalar_means_weighted,
    weigh_scalar_means,
)
from kerastower._keras_compat.seeds import GlobalSeeds, global_seeds
from kerastower._keras_compat.step_functions import (
    warn_once,
    warnings_shown_at_build,
)
from kerastower._keras_compat.tower_calls import (
    NOINLINE_FUNCTIONS,
    call_with_captures,
    calls_without_graph_optimizer,
    orders_calls_here,
    run_independently,
    tower_replica_context,
)
from kerastower._keras_compat.xla import compiled_in_towers

if KERAS_FAMILY >= 3:
    from kerastower._keras_compat import callbacks as _callbacks
    from kerastower._keras_compat import layers as _layers
    from kerastower._keras_compat import losses as _losses
    from kerastower._keras_compat import optimizers as _optimizers
    from kerastower._keras_compat import trainer as _trainer

    NORMALISED_REDUCTIONS = _losses.NORMALISED_REDUCTIONS
    RecordingScope = _layers.RecordingScope
    _loss_module = _losses._loss_module
    check_reductions = _losses.check_reductions
    divisor = _losses.divisor
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

RECORDS_ASSIGNMENTS = _layers.RECORDS_ASSIGNMENTS
SPECTRAL_NORMALIZATION = _layers.SPECTRAL_NORMALIZATION
activity_penalties_summed = _layers.activity_penalties_summed
assignments_to = _layers.assignments_to
draws_per_traced_op = _layers.draws_per_traced_op
freeze_spectral_update = _layers.freeze_spectral_update
override_batch_norm_moments = _layers.override_batch_norm_moments
restore_batch_norm = _layers.restore_batch_norm
restore_spectral_update = _layers.restore_spectral_update
spectral_update = _layers.spectral_update

get_keras_mask = _losses.get_keras_mask
loss_divisor = _losses.loss_divisor
set_keras_mask = _losses.set_keras_mask

SUPPORTS_REPLICAS = _optimizers.SUPPORTS_REPLICAS
build_optimizer = _optimizers.build_optimizer
clone_optimizer = _optimizers.clone_optimizer

Functional = _trainer.Functional
TrainerHooks = _trainer.TrainerHooks
build_before_towers = _trainer.build_before_towers
build_metrics = _trainer.build_metrics
compiled_losses_replaced = _trainer.compiled_losses_replaced
compute_loss = _trainer.compute_loss
forward = _trainer.forward
functional_init_arguments = _trainer.functional_init_arguments
graph_of = _trainer.graph_of
init_functional = _trainer.init_functional
inner_layers = _trainer.inner_layers
LOSS_TRACKED_BY_CONTAINER = _trainer.LOSS_TRACKED_BY_CONTAINER
METRICS_BUILT_BEFORE_FIT = _trainer.METRICS_BUILT_BEFORE_FIT
loss_metric_weight = _trainer.loss_metric_weight
loss_scaler = _trainer.loss_scaler
loss_tracker = _trainer.loss_tracker
per_output_loss_metrics = _trainer.per_output_loss_metrics
register_alias = _trainer.register_alias
register_serializable = _trainer.register_serializable

functional_variant = functools.partial(
    _functional_variant, register_alias=register_alias
)

__all__ = [
    "KERAS_FAMILY",
    "LOSS_TRACKED_BY_CONTAINER",
    "METRICS_BUILT_BEFORE_FIT",
    "NOINLINE_FUNCTIONS",
    "RECORDS_ASSIGNMENTS",
    "SPECTRAL_NORMALIZATION",
    "SUPPORTS_REPLICAS",
    "SUPPORTED_KERAS",
    "SUPPORTED_TENSORFLOW",
    "CheckpointHooks",
    "Functional",
    "GlobalSeeds",
    "KerasCompatibilityError",
    "TrainerHooks",
    "_attribute",
    "_fail",
    "activity_penalties_summed",
    "assignments_to",
    "build_before_towers",
    "build_metrics",
    "build_optimizer",
    "call_time_value",
    "call_with_captures",
    "calls_without_graph_optimizer",
    "orders_calls_here",
    "check_execution_steps",
    "check_prepared",
    "clone_optimizer",
    "compiled_in_towers",
    "compiled_losses_replaced",
    "compute_loss",
    "forward",
    "draws_per_traced_op",
    "freeze_spectral_update",
    "functional_init_arguments",
    "functional_variant",
    "get_keras_mask",
    "global_seeds",
    "graph_of",
    "init_functional",
    "inner_layers",
    "is_remote_path",
    "keras_files_hold_optimizer",
    "learning_rate_slot",
    "loss_divisor",
    "loss_metric_weight",
    "loss_scaler",
    "loss_tracker",
    "override_batch_norm_moments",
    "per_output_loss_metrics",
    "prepare_collective_ops",
    "print_msg",
    "register_alias",
    "register_serializable",
    "restore_batch_norm",
    "restore_spectral_update",
    "run_independently",
    "runtime_started",
    "scalar_means_weighted",
    "set_initial_epoch",
    "set_keras_mask",
    "spectral_update",
    "steps_per_execution",
    "strategy_made_after_start",
    "strategy_num_workers",
    "tower_replica_context",
    "warn_once",
    "warnings_shown_at_build",
    "weigh_scalar_means",
]
if KERAS_FAMILY >= 3:
    __all__ += [
        "NORMALISED_REDUCTIONS",
        "RecordingScope",
        "_loss_module",
        "check_reductions",
        "divisor",
    ]
