"""TensorFlow's collective-ops start-up, prepared before the runtime starts.

`tf.distribute.MultiWorkerMirroredStrategy` must be made before TensorFlow
starts its runtime (the first op, variable or layer): making it configures
collective ops, which TensorFlow allows only at start-up, and names every
device ``/job:worker/task:i/...`` instead of ``/job:localhost/...``. So a
script that builds its layers before its first `TowerModel` failed.

`prepare_collective_ops` (run when kerastower is imported under a TF_CONFIG
naming several workers) configures collective ops exactly as the strategy
will, and makes the runtime start, whenever something first starts it, as
that cluster worker. The strategy made later finds everything configured;
`check_prepared` then verifies that it asked for the very same set-up.
These are private TensorFlow hooks: each is checked, and a change raises an
error naming it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import tensorflow as tf

from kerastower._keras_compat.errors import _attribute as _keras_attribute
from kerastower._keras_compat.errors import _fail_tensorflow as _fail

_RESTART_WARNING = "Enabling collective ops after program startup"
_PREPARED: dict = {}  # the ServerDef the runtime started with, once prepared


def _attribute(obj, name: str, owner: str):
    return _keras_attribute(obj, name, owner, fail=_fail)


def _internals():
    try:
        from tensorflow.core.protobuf import rewriter_config_pb2, tensorflow_server_pb2
        from tensorflow.python.distribute import (
            collective_all_reduce_strategy,
            multi_worker_util,
        )
        from tensorflow.python.eager import context
    except ImportError as error:  # pragma: no cover - depends on TensorFlow
        raise _fail("tensorflow.python.eager.context", "cannot be imported") from error
    # The strategy's own module: TensorFlow moved it (`tensorflow.tsl` in 2.16,
    # `tensorflow.compiler.xla.tsl` later).
    coordination_config_pb2 = _attribute(
        collective_all_reduce_strategy,
        "coordination_config_pb2",
        "tensorflow.python.distribute.collective_all_reduce_strategy",
    )
    return (
        context,
        multi_worker_util,
        coordination_config_pb2,
        (
            rewriter_config_pb2,
            tensorflow_server_pb2,
        ),
    )


def _server_def(ctx, resolver, spec, task_type: str, task_id: int):
    """The `ServerDef` the strategy builds (`_initialize_multi_worker`)."""
    _, multi_worker_util, _, (rewriter_config_pb2, tensorflow_server_pb2) = _internals()
    config = copy.deepcopy(ctx.config)
    rewrite = config.graph_options.rewrite_options
    rewrite.scoped_allocator_optimization = rewriter_config_pb2.RewriterConfig.ON
    del rewrite.scoped_allocator_opts.enable_op[:]
    rewrite.scoped_allocator_opts.enable_op.append("CollectiveReduce")
    config.experimental.collective_group_leader = multi_worker_util.collective_leader(
        spec, task_type, task_id
    )
    del config.device_filters[:]
    config.device_filters.append(f"/job:{task_type}/task:{task_id}")
    return tensorflow_server_pb2.ServerDef(
        cluster=spec.as_cluster_def(),
        default_session_config=config,
        job_name=task_type,
        task_index=task_id,
        protocol=resolver.rpc_layer or "grpc",
        port=getattr(resolver, "port", 0),
    )


def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime has started in this process."""
    context, *_ = _internals()
    return _attribute(context.context(), "_context_handle", "Context") is not None


def prepare_collective_ops() -> bool:
    """Configures collective ops as `MultiWorkerMirroredStrategy` will.

    Reads `TF_CONFIG` (through TensorFlow's own resolver). Does nothing once
    the runtime has started: the strategy then fails with its own error.

    Returns:
        Whether collective ops were prepared.
    """
    context, multi_worker_util, coordination_config_pb2, _ = _internals()
    ctx = context.context()
    if runtime_started():
        return False
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
    task_type, task_id = resolver.task_type, resolver.task_id
    ctx.configure_collective_ops(
        collective_leader=multi_worker_util.collective_leader(spec, task_type, task_id),
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{task_type}/task:{task_id}",),
    )
    if ctx.coordination_service is None and task_type in ("chief", "worker"):
        ctx.configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(spec),
            coordinated_jobs=[
                coordination_config_pb2.CoordinatedJob(
                    name=job, num_tasks=spec.num_tasks(job)
                )
                for job in ("chief", "worker")
                if job in spec.jobs
            ],
        )
    start = _attribute(ctx, "ensure_initialized", "Context")

    def ensure_initialized():
        # The server is described by the configuration in force when the
        # runtime starts (logical devices, memory growth set after import).
        if not _attribute(ctx, "_initialized", "Context"):
            server_def = _server_def(ctx, resolver, spec, task_type, task_id)
            _PREPARED["server_def"] = server_def
            ctx.enable_collective_ops(server_def)
        del ctx.ensure_initialized
        start()

    ctx.ensure_initialized = ensure_initialized
    return True


class _DropRestartWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _RESTART_WARNING not in record.getMessage()


@contextmanager
def strategy_made_after_start() -> Iterator[None]:
    """Hides TensorFlow's warning that collectives are enabled after start-up.

    With `prepare_collective_ops`, the runtime already runs the server that
    the strategy asks for, so the warning does not apply.
    """
    loggers = [logging.getLogger("absl"), tf.get_logger()]
    quiet = _DropRestartWarning()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def check_prepared() -> None:
    """Checks that the strategy just made asked for the server already running.

    Raises:
        KerasCompatibilityError: If TensorFlow's strategy set collective ops up
            differently from `prepare_collective_ops`.
    """
    context, *_ = _internals()
    prepared = _PREPARED.get("server_def")
    if prepared is None:
        return
    started = _attribute(context.context(), "_collective_ops_server_def", "Context")
    if started != prepared:
        raise _fail(
            "MultiWorkerMirroredStrategy._initialize_multi_worker",
            "set collective ops up differently from how kerastower prepared them",
        )


def strategy_num_workers(strategy: tf.distribute.Strategy) -> int:
    """How many workers `strategy` spans (1 for one-machine strategies)."""
    if not isinstance(strategy, tf.distribute.experimental.MultiWorkerMirroredStrategy):
        return 1
    return int(
        _keras_attribute(
            strategy.extended, "_num_workers", "CollectiveAllReduceExtended"
        )
    )
