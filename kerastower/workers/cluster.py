"""Who this process is in a multi-worker cluster, read from `TF_CONFIG`.

Plain Python, public as `kerastower.cluster` (whose docstring says what
`TF_CONFIG` holds, who the chief is and how the workers are numbered).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

TRAINING_TASK_TYPES = ("chief", "worker")
EVALUATOR = "evaluator"


def _error(rule: str, received: Any) -> ValueError:
    return ValueError(f"`TF_CONFIG` {rule}. Received: TF_CONFIG={received!r}")


def parse_tf_config(text: str | None) -> dict[str, Any] | None:
    """Parses and validates the text of a `TF_CONFIG` variable.

    Example:

    ```python
    import kerastower

    config = kerastower.cluster.parse_tf_config(
        '{"cluster": {"worker": ["a:1", "b:1"]}, '
        '"task": {"type": "worker", "index": 1}}'
    )
    print(config["task"])  # {'type': 'worker', 'index': 1}
    ```

    Args:
        text: The variable's value, or ``None`` when it is not set.

    Returns:
        The parsed dict, or ``None`` for a single worker: `text` is ``None``,
        blank, or ``"{}"`` (as TensorFlow treats them).

    Raises:
        ValueError: If `text` is not a JSON object; lacks ``"cluster"`` (a
            non-empty object mapping task types to lists of addresses) or
            ``"task"`` (an object with a string ``"type"`` and an integer
            ``"index"``); names a task type that is not in the cluster; gives
            an index outside ``[0, len(cluster[type]))``; has more than one
            ``"chief"`` or ``"evaluator"``; or has ``"ps"`` tasks (parameter
            servers, which kerastower does not use). The message quotes the
            received text.
    """
    if text is None or not text.strip():
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _error(f"must be valid JSON ({error})", text) from None
    if not isinstance(config, dict):
        raise _error("must be a JSON object", text)
    if not config:
        return None
    for key in ("cluster", "task"):
        if key not in config:
            raise _error(f'must have a "{key}" entry', text)
    cluster, task = config["cluster"], config["task"]
    if not isinstance(cluster, dict) or not cluster:
        raise _error(
            '"cluster" must be a non-empty object mapping task types to lists '
            "of addresses",
            text,
        )
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(
            isinstance(a, str) for a in addresses
        ):
            raise _error(
                f'"cluster" entry "{task_type}" must be a list of address strings',
                text,
            )
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise _error('"task" must be an object with "type" and "index"', text)
    task_type, index = task["type"], task["index"]
    if not isinstance(task_type, str) or task_type not in cluster:
        raise _error(
            f'"task" type must be one of the cluster\'s task types '
            f"{sorted(cluster)}; got {task_type!r}",
            text,
        )
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise _error(f'"task" index must be an integer; got {index!r}', text)
    count = len(cluster[task_type])
    if not 0 <= index < count:
        raise _error(
            f'"task" index must be in [0, {count}) for the {count} '
            f'"{task_type}" task(s); got {index}',
            text,
        )
    if "ps" in cluster:
        raise _error(
            'names "ps" tasks: parameter servers are for '
            "`tf.distribute.ParameterServerStrategy`, which kerastower does not "
            'use; TowerModel trains on "chief" and "worker" tasks with '
            '`MultiWorkerMirroredStrategy`. Remove the "ps" entries',
            text,
        )
    for single in ("chief", EVALUATOR):
        if len(cluster.get(single, [])) > 1:
            raise _error(f'"cluster" may have at most one "{single}"', text)
    return config


def tf_config() -> dict[str, Any] | None:
    """Returns the parsed and validated `TF_CONFIG`, or ``None`` if unset.

    Reads the environment variable each time it is called.

    Returns:
        The parsed dict, or ``None`` for a single worker (see
        `parse_tf_config`).

    Raises:
        ValueError: If `TF_CONFIG` is malformed (see `parse_tf_config`).
    """
    return parse_tf_config(os.environ.get("TF_CONFIG"))


def num_workers_of(config: dict[str, Any] | None) -> int:
    """Returns the number of training workers (chief and workers) in `config`.

    Args:
        config: A parsed `TF_CONFIG` (see `parse_tf_config`), or ``None`` for
            a single worker.

    Returns:
        The number of ``"chief"`` and ``"worker"`` tasks; 1 for ``None``.
    """
    if config is None:
        return 1
    return sum(len(config["cluster"].get(t, [])) for t in TRAINING_TASK_TYPES)


def worker_index_of(config: dict[str, Any] | None) -> int:
    """Returns this task's global worker index in `config`, the chief first.

    With a ``"chief"`` task the chief is 0 and worker ``i`` is ``i + 1``;
    without one, worker ``i`` is ``i``.

    Args:
        config: A parsed `TF_CONFIG` (see `parse_tf_config`), or ``None`` for
            a single worker.

    Returns:
        The index, from 0; 0 for ``None``.

    Raises:
        ValueError: If the task is not a training task (such as ``"ps"``).
    """
    if config is None:
        return 0
    task_type, index = config["task"]["type"], int(config["task"]["index"])
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return index + len(config["cluster"].get("chief", []))
    raise ValueError(
        "Only chief and worker tasks have a worker index. Received: "
        f"task type={task_type!r} in TF_CONFIG={json.dumps(config)!r}"
    )


def is_chief_of(config: dict[str, Any] | None) -> bool:
    """Whether the task in `config` is the chief.

    The chief is the ``"chief"`` task, or worker 0 when the cluster has no
    ``"chief"``; without a config the single process is the chief.

    Args:
        config: A parsed `TF_CONFIG` (see `parse_tf_config`), or ``None`` for
            a single worker.

    Returns:
        ``True`` for the chief, ``False`` for every other task.
    """
    if config is None:
        return True
    task_type, index = config["task"]["type"], int(config["task"]["index"])
    if "chief" in config["cluster"] and config["cluster"]["chief"]:
        return task_type == "chief"
    return task_type == "worker" and index == 0


def num_workers() -> int:
    """Returns the number of training workers in `TF_CONFIG` (1 when unset).

    Returns:
        The number of ``"chief"`` and ``"worker"`` tasks of the cluster.

    Raises:
        ValueError: If `TF_CONFIG` is malformed (see `parse_tf_config`).
    """
    return num_workers_of(tf_config())


def worker_index() -> int:
    """Returns this process's worker index, the chief first (0 when unset).

    Example:

    ```python
    import kerastower

    index = kerastower.worker_index()  # 0 on the chief and without TF_CONFIG
    print(f"worker {index} of {kerastower.num_workers()}")
    ```

    Returns:
        The index, from 0 (see `worker_index_of`).

    Raises:
        ValueError: If `TF_CONFIG` is malformed (see `parse_tf_config`) or
            this task is not a training task.
    """
    return worker_index_of(tf_config())


def is_multi_worker() -> bool:
    """Whether this process is one of several training workers in `TF_CONFIG`.

    Returns:
        ``True`` when the cluster has two or more training workers and this
        task is one of them (not the ``"evaluator"``).

    Raises:
        ValueError: If `TF_CONFIG` is malformed (see `parse_tf_config`).
    """
    config = tf_config()
    return num_workers_of(config) > 1 and config["task"]["type"] in (
        TRAINING_TASK_TYPES
    )


def is_evaluator() -> bool:
    """Whether `TF_CONFIG` makes this process the ``"evaluator"`` task.

    The evaluator runs `kerastower.evaluator.SidecarEvaluator` instead of
    `fit` (see its example).

    Returns:
        ``True`` for the ``"evaluator"`` task, ``False`` otherwise (also
        without `TF_CONFIG`).

    Raises:
        ValueError: If `TF_CONFIG` is malformed (see `parse_tf_config`).
    """
    config = tf_config()
    return config is not None and config["task"]["type"] == EVALUATOR


def is_chief(strategy: Any = None) -> bool:
    """Whether this process is the chief, the one that writes checkpoints.

    Without `strategy`, the answer comes from `TF_CONFIG` alone. With a
    `tf.distribute.Strategy`, its ``extended.should_checkpoint`` (where it
    exists) must agree as well: a multi-worker strategy answers for the
    cluster it was built from (which may not come from `TF_CONFIG`), while a
    one-worker strategy (the default one, `MirroredStrategy`) says ``True`` in
    every process, so `TF_CONFIG` still tells its processes apart.

    Example:

    ```python
    import keras

    import kerastower

    inputs = keras.Input((4,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
    if kerastower.is_chief(model.distribute_strategy):  # True without TF_CONFIG
        model.save("final.keras")
    ```

    Args:
        strategy: A `tf.distribute.Strategy`, or ``None``. Defaults to
            ``None``.

    Returns:
        ``True`` on the chief (and in a single process), ``False`` elsewhere.

    Raises:
        ValueError: If `TF_CONFIG` is malformed (see `parse_tf_config`).
    """
    chief = is_chief_of(tf_config())
    extended = getattr(strategy, "extended", None)
    should_checkpoint = getattr(extended, "should_checkpoint", None)
    if should_checkpoint is not None:
        chief = chief and bool(should_checkpoint)
    return chief


def _validated_shard_args(num_workers: int | None, index: int | None) -> tuple:
    config = None
    if num_workers is None or index is None:
        config = tf_config()
    if num_workers is None:
        num_workers = num_workers_of(config)
    if index is None:
        index = worker_index_of(config)
    if (
        isinstance(num_workers, bool)
        or not isinstance(num_workers, (int, np.integer))
        or num_workers < 1
    ):
        raise ValueError(
            "`num_workers` must be an integer >= 1. "
            f"Received: num_workers={num_workers!r}"
        )
    if (
        isinstance(index, bool)
        or not isinstance(index, (int, np.integer))
        or not 0 <= index < num_workers
    ):
        raise ValueError(
            f"`index` must be an integer in [0, num_workers). Received: "
            f"index={index!r}, num_workers={num_workers}"
        )
    return int(num_workers), int(index)


def shard(data: Any, num_workers: int | None = None, index: int | None = None) -> Any:
    """Keeps every `num_workers`-th example of `data`, starting at `index`.

    Example ``k`` (along the first axis) goes to worker ``k mod W``, for ``W``
    workers: the same rule as `tf.data.Dataset.shard`, which is what this calls
    for a dataset. For arrays, every array in a nest (tuple, list, dict) is
    cut the same way, ``a[index::num_workers]``.

    Shard **before** batching, and batch each worker's shard with the
    **per-worker** batch size ``B / W``, where ``B`` is the **global** batch
    size (all workers together). Then the ``W`` per-worker batches of step
    ``s`` hold exactly the ``B`` examples of the global batch ``s`` of the
    unsharded data, in another order, as long as ``B`` is a multiple of ``W``
    and the data is not shuffled (or shuffled with the same seed on every
    worker before sharding). When the number of examples is not a multiple of
    ``W``, the first workers get one example more; drop the remainder so that
    every worker runs the same number of steps.

    Example:

    ```python
    import numpy as np
    import tensorflow as tf

    import kerastower

    x = np.arange(10, dtype="float32")[:, None]
    y = 2 * x
    x_local, y_local = kerastower.cluster.shard((x, y), num_workers=2, index=1)
    print(x_local[:, 0])  # [1. 3. 5. 7. 9.]: examples 1, 3, 5, ... of 10
    # Without num_workers and index, TF_CONFIG says which part is this worker's.
    dataset = kerastower.cluster.shard(tf.data.Dataset.from_tensor_slices((x, y)))
    ```

    Args:
        data: A `tf.data.Dataset`, or an array (NumPy or tensor) or a nest of
            arrays with examples along the first axis.
        num_workers: The number of workers ``W``; ``None`` reads it from
            `TF_CONFIG`. Defaults to ``None``.
        index: This worker's index in ``[0, W)``; ``None`` reads it from
            `TF_CONFIG` (chief first). Defaults to ``None``.

    Returns:
        This worker's shard, of the same kind as `data`.

    Raises:
        ValueError: If `num_workers` is not an integer >= 1 or `index` is not
            an integer in ``[0, num_workers)``, or `TF_CONFIG` is malformed.
    """
    num_workers, index = _validated_shard_args(num_workers, index)
    shard_method = getattr(data, "shard", None)
    if callable(shard_method) and hasattr(data, "element_spec"):
        return data.shard(num_workers, index)
    if isinstance(data, dict):
        return {k: shard(v, num_workers, index) for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        parts = [shard(v, num_workers, index) for v in data]
        return type(data)(*parts) if hasattr(data, "_fields") else type(data)(parts)
    if data is None:
        return None
    if not hasattr(data, "__getitem__") or not hasattr(data, "shape"):
        raise ValueError(
            "`data` must be a tf.data.Dataset, an array or a tuple, list or "
            f"dict of arrays. Received: data of type {type(data).__name__}"
        )
    return data[index::num_workers]
