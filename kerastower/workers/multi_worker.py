"""This process's place in a cluster: `MultiWorkerMirroredStrategy`, made once.

Public as `kerastower.multi_worker`, whose docstring says how the workers
train together and when the cluster is set up.
"""

from __future__ import annotations

import warnings

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.workers import cluster

DEFAULT_TIMEOUT_SECONDS: float | None = None
"""No limit: a collective operation waits for the other workers as long as
it takes, as `MultiWorkerMirroredStrategy`'s do by default, unless
`worker_strategy(timeout_seconds=...)` sets one."""
_STRATEGY: tf.distribute.Strategy | None = None
_TIMEOUT_SECONDS = DEFAULT_TIMEOUT_SECONDS


def prepare_workers() -> bool:
    """Prepares this process to be a cluster worker, when `TF_CONFIG` says so.

    kerastower calls it when it is imported (after
    it sets up the logical CPUs that ``KERASTOWER_LOGICAL_DEVICES`` asks for;
    the ``kerastower`` command line is
    never prepared). Under a `TF_CONFIG` naming two or more training workers,
    it configures TensorFlow's collective ops the way
    `MultiWorkerMirroredStrategy` will, so that the runtime, whenever the
    script first starts it (a layer, a tensor, a data set), starts as this
    cluster worker. It changes nothing else and does not connect yet.

    A malformed `TF_CONFIG` is left for `worker_strategy` to report.

    Returns:
        Whether the process was prepared.
    """
    try:
        config = cluster.tf_config()
    except ValueError:
        return False
    if cluster.num_workers_of(config) < 2:
        return False
    if config["task"]["type"] not in cluster.TRAINING_TASK_TYPES:
        return False
    return _keras_compat.prepare_collective_ops()


def worker_strategy(
    timeout_seconds: float | None = None,
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """Returns this process's `MultiWorkerMirroredStrategy`, made once.

    `TowerModel` calls it itself when `TF_CONFIG` names two or more workers;
    call it yourself to choose `timeout_seconds` (only the first call's is
    used; a later call asking for another warns) or to use the strategy
    directly. It may come before or after the model is built, provided
    kerastower was imported before TensorFlow started its runtime (see
    `prepare_workers`).

    Example:

    ```python
    import kerastower

    kerastower.configure_logical_devices(2)  # without GPUs: 2 towers per worker
    strategy = kerastower.worker_strategy(timeout_seconds=300)
    print(kerastower.num_workers())  # from TF_CONFIG; 1 without it
    ```

    A worker that dies stops the others without a timeout: TensorFlow's
    heartbeats between the workers find it within seconds and abort their
    collectives with an ``UnavailableError``. A timeout also ends a run in
    which a worker is alive but stuck (in a callback, its input pipeline, a
    deadlock), which otherwise waits for it forever. It has a cost:
    TensorFlow gives every collective run with a timeout a thread that
    sleeps for the whole timeout, about ``2 * C * S * timeout_seconds``
    sleeping threads of some 8 KB each for ``C`` sums over the workers a
    step and ``S`` steps a second (a few per layer with
    `BatchNormalization`): 60 s at 10 steps a second and 10 sums a step is
    some 12,000 threads. Keep it for debugging a hang, or for slow steps.

    Args:
        timeout_seconds: How long a collective operation may wait for the
            other workers before failing, in seconds, or ``None`` (the
            default) for no limit.

    Returns:
        The strategy; the same object on every call.

    Raises:
        ValueError: If `timeout_seconds` is neither ``None`` nor positive, or
            `TF_CONFIG` is malformed.
        RuntimeError: If TensorFlow started its runtime before kerastower was
            imported, so the cluster can no longer be set up.
    """
    global _STRATEGY, _TIMEOUT_SECONDS
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ValueError(
            "`timeout_seconds` must be > 0 or None. "
            f"Received: timeout_seconds={timeout_seconds!r}"
        )
    if _STRATEGY is None:
        cluster.tf_config()  # validates TF_CONFIG with a clear error
        _TIMEOUT_SECONDS = timeout_seconds
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=_TIMEOUT_SECONDS
        )
        try:
            with _keras_compat.strategy_made_after_start():
                strategy = tf.distribute.MultiWorkerMirroredStrategy(
                    communication_options=options
                )
        except RuntimeError as error:
            raise RuntimeError(
                "TF_CONFIG names several workers, but TensorFlow started its "
                "runtime before kerastower was imported, so the cluster can no "
                "longer be set up. Move `import kerastower` above the first "
                "layer, model, tensor or data set of the program (importing "
                "keras or tensorflow before it is fine)."
            ) from error
        _keras_compat.check_prepared()
        _STRATEGY = strategy
    elif timeout_seconds is not None and timeout_seconds != _TIMEOUT_SECONDS:
        warnings.warn(
            f"`timeout_seconds={timeout_seconds:g}` is ignored: this process's "
            f"strategy was made with timeout_seconds={_TIMEOUT_SECONDS}, by "
            "an earlier call or by the first TowerModel. Call "
            "`kerastower.worker_strategy(timeout_seconds=...)` before building "
            "the model.",
            stacklevel=2,
        )
    return _STRATEGY


def timeout() -> float:
    """How long a collective operation may wait for the other workers.

    Returns:
        The timeout in seconds that the first `worker_strategy` call set, or
        0.0 for none (TensorFlow's collectives read 0 as no limit).
    """
    return _TIMEOUT_SECONDS or 0.0
