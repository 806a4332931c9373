"""What `kerastower launch` gives each worker: its `TF_CONFIG`, ports, towers.

Plain Python with no TensorFlow, so that the launcher starts at once.
`tf_config_for` also serves a real cluster (``kerastower launch --hosts``).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

LOOPBACK = "127.0.0.1"
"""The address of the local workers that `launch` starts."""
# How many logical CPUs a worker makes on a machine without a GPU
# (`kerastower.devices.configure_from_environment`).
LOGICAL_DEVICES_VARIABLE = "KERASTOWER_LOGICAL_DEVICES"
# A file that `kerastower launch --evaluator` creates once every worker has
# finished: the evaluator's sign that training has ended.
TRAINING_DONE_VARIABLE = "KERASTOWER_TRAINING_DONE_FILE"


def check_count(name: str, value: Any) -> int:
    """Returns `value` if it is an integer >= 1, else raises a `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`{name}` must be an integer >= 1. Received: {name}={value!r}"
        )
    return value


def tf_config_for(
    hosts: str | Sequence[str], index: int, evaluator: str | None = None
) -> dict[str, Any]:
    """Returns the `TF_CONFIG` of one worker of a cluster of workers.

    Example:

    ```python
    from kerastower.launch import tf_config_for

    print(tf_config_for("host0:2222,host1:2222", 1))
    # {'cluster': {'worker': ['host0:2222', 'host1:2222']},
    #  'task': {'type': 'worker', 'index': 1}}
    ```

    Args:
        hosts: The ``host:port`` address of every worker, worker 0 (the
            chief) first: a list, or one comma-separated string.
        index: This worker's index in `hosts`.
        evaluator: The ``host:port`` of the cluster's ``"evaluator"`` task,
            or ``None`` for a cluster without one. The evaluator's own
            `TF_CONFIG` is the same with the task ``{"type": "evaluator",
            "index": 0}``. Defaults to ``None``.

    Returns:
        The config as a dict, ready for `json.dumps`.

    Raises:
        ValueError: If `hosts` is empty, an address is not ``host:port`` with
            an integer port in ``[1, 65535]``, or `index` is not in
            ``[0, len(hosts))``.
    """
    if isinstance(hosts, str):
        hosts = [h.strip() for h in hosts.split(",") if h.strip()]
    if not hosts:
        raise ValueError(f"`hosts` must name a worker. Received: hosts={hosts!r}")
    for address in [*hosts, *([] if evaluator is None else [evaluator])]:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                "Each host must be `host:port` with a port in [1, 65535]. "
                f"Received: host={address!r}"
            )
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"`index` must be an integer. Received: index={index!r}")
    if not 0 <= index < len(hosts):
        raise ValueError(
            f"`index` must be in [0, {len(hosts)}), one per host. "
            f"Received: index={index}"
        )
    cluster = {"worker": list(hosts)}
    if evaluator is not None:
        cluster["evaluator"] = [evaluator]
    return {"cluster": cluster, "task": {"type": "worker", "index": index}}


def evaluator_tf_config(hosts: str | Sequence[str], evaluator: str) -> dict[str, Any]:
    """Returns the `TF_CONFIG` of the ``"evaluator"`` task beside `hosts`.

    The evaluator trains nothing: it evaluates the checkpoints the workers
    write (`kerastower.evaluator.SidecarEvaluator`).

    Args:
        hosts: The workers' ``host:port`` addresses, as for `tf_config_for`.
        evaluator: The evaluator's ``host:port``.

    Returns:
        The config as a dict: the workers and the evaluator in the cluster,
        the task ``{"type": "evaluator", "index": 0}``.

    Raises:
        ValueError: If an address is invalid (see `tf_config_for`).
    """
    config = tf_config_for(hosts, 0, evaluator)
    config["task"] = {"type": "evaluator", "index": 0}
    return config


def free_loopback_ports(n: int) -> list[int]:
    """Returns `n` distinct TCP ports that are free on ``127.0.0.1`` now.

    The operating system picks them, all held at once so that they differ,
    and they are released before returning: another program could still take
    one before a worker binds it, as with any free-port probe.

    Args:
        n: How many ports.

    Returns:
        The port numbers.

    Raises:
        ValueError: If `n` is less than 1.
    """
    check_count("n", n)
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def towers_per_worker(
    towers: str | int | Sequence[int] | None, num_workers: int
) -> list[int] | None:
    """Gives every worker its number of towers.

    Workers may have different numbers of towers: ``"2,3"`` gives worker 0
    two towers and worker 1 three.

    Args:
        towers: One number for every worker, one per worker, or a string of
            either (``"2"``, ``"2,3"``, as ``--towers`` takes them); ``None``
            leaves the choice to each worker.
        num_workers: The number of workers.

    Returns:
        One number per worker, or ``None`` when `towers` is ``None``.

    Raises:
        ValueError: If `num_workers` or a number of towers is not an integer
            of at least 1, or there is more than one and not one per worker.
    """
    check_count("num_workers", num_workers)
    if isinstance(towers, str):
        try:
            towers = [int(t) for t in towers.split(",")]
        except ValueError:
            raise ValueError(
                "`towers` must be an integer >= 1, or a comma-separated list "
                f"with one per worker. Received: towers={towers!r}"
            ) from None
        towers = towers[0] if len(towers) == 1 else towers
    if towers is None:
        return None
    if isinstance(towers, int):
        towers = [towers] * num_workers
    counts = [check_count("towers", t) for t in towers]
    if len(counts) != num_workers:
        raise ValueError(
            "`towers` must give one number for all workers or one per worker "
            f"({num_workers}). Received: towers={counts}"
        )
    return counts
