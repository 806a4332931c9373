"""The private Keras hooks kerastower relies on, each checked against Keras.

Public Keras API is used wherever one exists. What has none (a loss's
per-element values and mask, Keras's masking of sample weights) is reached
here and nowhere else (so is TensorFlow's collective-ops start-up), and each
hook is checked once against the installed Keras: when Keras changes one, the
user gets an error that names the hook and the Keras version, never a silently
different model.

The package is that one place: `errors` (the error and the supported
range), `losses` (loss reduction and masks), `trainer` (model and trainer
hooks), `layers` (`SpectralNormalization`'s update, `StatelessScope`), `callbacks`
(callbacks, optimizers, strategies), `optimizers` (an optimizer's copy for
replicas), `metrics` (a `Mean` of a batch scalar updated in a tower), `xla` (XLA per
tower), `collectives` (TensorFlow's multi-worker start-up) and `tower_calls`
(one traced tower function called on every device).
"""

from kerastower._keras_compat.callbacks import (
    CheckpointHooks,
    check_execution_steps,
    is_remote_path,
    learning_rate_slot,
    print_msg,
    set_initial_epoch,
    strategy_num_workers,
)
from kerastower._keras_compat.collectives import (
    call_time_value,
    check_prepared,
    prepare_collective_ops,
    runtime_started,
    strategy_made_after_start,
)
from kerastower._keras_compat.errors import (
    SUPPORTED_KERAS,
    SUPPORTED_TENSORFLOW,
    KerasCompatibilityError,
    _attribute,
    _fail,
)
from kerastower._keras_compat.layers import (
    RecordingScope,
    activity_penalties_summed,
    freeze_spectral_update,
    restore_spectral_update,
    spectral_update,
)
from kerastower._keras_compat.losses import (
    NORMALISED_REDUCTIONS,
    _loss_module,
    check_reductions,
    divisor,
    get_keras_mask,
    loss_divisor,
    set_keras_mask,
)
from kerastower._keras_compat.metrics import (
    scalar_means_weighted,
    weigh_scalar_means,
)
from kerastower._keras_compat.optimizers import clone_optimizer
from kerastower._keras_compat.tower_calls import (
    calls_without_graph_optimizer,
    run_independently,
    tower_replica_context,
)
from kerastower._keras_compat.trainer import (
    Functional,
    TrainerHooks,
    compiled_losses_replaced,
    compute_loss,
    forward,
    functional_init_arguments,
    functional_variant,
    graph_of,
    init_functional,
    inner_layers,
    loss_tracker,
    override_batch_norm_moments,
    per_output_loss_metrics,
    register_alias,
    restore_batch_norm,
    warn_once,
    warnings_shown_at_build,
)
from kerastower._keras_compat.xla import compiled_in_towers

__all__ = [
    "check_execution_steps",
    "activity_penalties_summed",
    "call_time_value",
    "calls_without_graph_optimizer",
    "tower_replica_context",
    "SUPPORTED_KERAS",
    "SUPPORTED_TENSORFLOW",
    "NORMALISED_REDUCTIONS",
    "RecordingScope",
    "CheckpointHooks",
    "Functional",
    "KerasCompatibilityError",
    "TrainerHooks",
    "_attribute",
    "_fail",
    "_loss_module",
    "check_prepared",
    "check_reductions",
    "clone_optimizer",
    "compiled_in_towers",
    "compiled_losses_replaced",
    "compute_loss",
    "divisor",
    "forward",
    "freeze_spectral_update",
    "functional_init_arguments",
    "functional_variant",
    "get_keras_mask",
    "graph_of",
    "init_functional",
    "inner_layers",
    "is_remote_path",
    "learning_rate_slot",
    "loss_divisor",
    "scalar_means_weighted",
    "weigh_scalar_means",
    "loss_tracker",
    "strategy_num_workers",
    "override_batch_norm_moments",
    "per_output_loss_metrics",
    "prepare_collective_ops",
    "print_msg",
    "register_alias",
    "restore_batch_norm",
    "restore_spectral_update",
    "run_independently",
    "runtime_started",
    "set_initial_epoch",
    "set_keras_mask",
    "spectral_update",
    "strategy_made_after_start",
    "warn_once",
    "warnings_shown_at_build",
]
