"""A Slurm task's `TF_CONFIG`, read from the environment `srun` gives it.

``srun kerastower launch --slurm train.py`` starts one launcher per Slurm
task; each reads its task's variables and gives its worker the `TF_CONFIG`
and ``CUDA_VISIBLE_DEVICES`` that TensorFlow's `SlurmClusterResolver` would.
Plain Python with no TensorFlow, so that the launcher starts at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from kerastower.workers.configs import check_count, tf_config_for

DEFAULT_PORT_BASE = 8888
_MAX_PORT = 65535
_HOST_PART = re.compile(r"([^\[\],]*)(?:\[([^\[\]]+)\]([^\[\],]*))?")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TASK_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_GPU_COUNT = re.compile(r"(?:[^:]+:)?(\d+)")


class SlurmTask(NamedTuple):
    """What one Slurm task's worker gets: its `TF_CONFIG` and its GPUs.

    Attributes:
        tf_config: The `TF_CONFIG` as a dict, ready for `json.dumps`.
        cuda_visible_devices: The value for ``CUDA_VISIBLE_DEVICES``, or
            ``None`` to leave the variable as it is.
    """

    tf_config: dict[str, Any]
    cuda_visible_devices: str | None


def _ill_formed(name: str, rule: str, value: str) -> ValueError:
    return ValueError(f"`{name}` must be {rule}. Received: {name}={value!r}")


def expand_hostlist(hostlist: str, name: str = "hostlist") -> list[str]:
    """Expands a Slurm host list into its host names, in order.

    Example:

    ```python
    from kerastower.workers.slurm import expand_hostlist

    print(expand_hostlist("node[01-03,7],gpu-a"))
    # ['node01', 'node02', 'node03', 'node7', 'gpu-a']
    ```

    A number keeps the width of the range's first number (``node[8-10]``
    gives ``node8``, ``node9``, ``node10``); text may follow the brackets
    (``n[1-2]-ib``).

    Args:
        hostlist: The list, as ``SLURM_STEP_NODELIST`` gives it.
        name: The name of the list in an error message. Defaults to
            ``"hostlist"``.

    Returns:
        The host names; none is dropped or sorted.

    Raises:
        ValueError: If `hostlist` is not a Slurm host list.
    """
    rule = "a Slurm host list such as `node[01-03,7],gpu-a`"
    hosts: list[str] = []
    for part in re.split(r",(?![^\[]*\])", hostlist.strip()):
        match = _HOST_PART.fullmatch(part)
        if not part or match is None:
            raise _ill_formed(name, rule, hostlist)
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            hosts.append(prefix)
            continue
        for item in ranges.split(","):
            bounds = _RANGE.fullmatch(item)
            if bounds is None or int(bounds[1]) > int(bounds[2] or bounds[1]):
                raise _ill_formed(name, rule, hostlist)
            first, last = bounds[1], bounds[2] or bounds[1]
            hosts += [
                f"{prefix}{n:0{len(first)}d}{suffix}"
                for n in range(int(first), int(last) + 1)
            ]
    return hosts


def expand_tasks_per_node(
    tasks_per_node: str, name: str = "tasks_per_node"
) -> list[int]:
    """Expands Slurm's tasks per node (``2(x3),1``) into one count per node.

    Args:
        tasks_per_node: The counts, as ``SLURM_STEP_TASKS_PER_NODE`` gives
            them: ``n`` for one node, ``n(xk)`` for `k` nodes of `n` tasks.
        name: The name of the counts in an error message. Defaults to
            ``"tasks_per_node"``.

    Returns:
        The number of tasks of each node, in the order of the host list.

    Raises:
        ValueError: If `tasks_per_node` is not of that form, or a count is 0.
    """
    counts: list[int] = []
    for part in tasks_per_node.strip().split(","):
        match = _TASK_COUNT.fullmatch(part)
        if match is None or int(match[1]) < 1 or int(match[2] or 1) < 1:
            raise _ill_formed(
                name, "a Slurm task count list such as `2(x3),1`", tasks_per_node
            )
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def _variable(environ: Mapping[str, str], name: str) -> str:
    if name not in environ:
        raise ValueError(
            f"`{name}` must be set, as `srun` sets it in each task: run "
            "`srun kerastower launch --slurm script.py`. "
            f"Received: {name} not set"
        )
    return environ[name]


def _integer(environ: Mapping[str, str], name: str, low: int) -> int:
    value = _variable(environ, name)
    if not value.strip().isdecimal() or int(value) < low:
        raise _ill_formed(name, f"an integer >= {low}", value)
    return int(value)


def _gpus_per_task(environ: Mapping[str, str], gpus_per_task: int | None) -> int | None:
    if gpus_per_task is not None:
        return check_count("gpus_per_task", gpus_per_task)
    value = environ.get("SLURM_GPUS_PER_TASK")
    if value is None:
        return None
    match = _GPU_COUNT.fullmatch(value.strip())
    if match is None or int(match[1]) < 1:
        rule = "a number of GPUs >= 1, after a type or not (`2`, `a100:2`)"
        raise _ill_formed("SLURM_GPUS_PER_TASK", rule, value)
    return int(match[1])


def _check_placement(environ: Mapping[str, str], host: str, local_id: int) -> None:
    """Checks that this task runs where the block distribution puts it."""
    rank = environ["SLURM_PROCID"]
    hint = "start the tasks with `srun --distribution=block` (Slurm's default)"
    node = environ.get("SLURMD_NODENAME")
    if node is not None and node != host:
        raise ValueError(
            f"`SLURMD_NODENAME` must be {host!r}, the node on which Slurm's "
            f"block distribution puts task SLURM_PROCID={rank}: {hint}. "
            f"Received: SLURMD_NODENAME={node!r}"
        )
    local = environ.get("SLURM_LOCALID")
    if local is not None and local.strip() != str(local_id):
        raise ValueError(
            f"`SLURM_LOCALID` must be {local_id}, the place of task "
            f"SLURM_PROCID={rank} on its node in Slurm's block distribution: "
            f"{hint}. Received: SLURM_LOCALID={local!r}"
        )


def slurm_task(
    environ: Mapping[str, str],
    *,
    port_base: int = DEFAULT_PORT_BASE,
    gpus_per_task: int | None = None,
) -> SlurmTask:
    """Returns the `TF_CONFIG` and GPUs of this Slurm task's worker.

    Every task of the job step is a ``"worker"``, in Slurm's task order:
    the tasks of the first node of ``SLURM_STEP_NODELIST`` first (Slurm's
    default block distribution), the task with ``SLURM_PROCID=r`` being
    worker ``r``, and worker 0 the chief. The ``i``-th task on a node
    listens on port ``port_base + i`` of that node and, with ``g`` GPUs per
    task, sees the node's GPUs ``i*g`` to ``i*g + g - 1``
    (``CUDA_VISIBLE_DEVICES``). This is what TensorFlow's
    `tf.distribute.cluster_resolver.SlurmClusterResolver` gives, except that
    the resolver orders the nodes by name (``node10`` before ``node8``) where
    Slurm numbers the tasks in the order of its node list.

    Example:

    ```python
    from kerastower.workers.slurm import slurm_task

    environ = {
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "node[01-02]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    print(slurm_task(environ, gpus_per_task=2))
    # SlurmTask(tf_config={'cluster': {'worker': ['node01:8888', 'node01:8889',
    #   'node02:8888', 'node02:8889']}, 'task': {'type': 'worker', 'index': 3}},
    #   cuda_visible_devices='2,3')
    ```

    Read from `environ`: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
    ``SLURM_STEP_NODELIST``, ``SLURM_STEP_TASKS_PER_NODE`` (``srun`` sets
    them in every task), ``SLURM_GPUS_PER_TASK`` when `gpus_per_task` is
    ``None``, and, to check that this task runs where the block
    distribution puts it, ``SLURMD_NODENAME`` and ``SLURM_LOCALID`` when set.

    Args:
        environ: The task's environment, such as `os.environ`.
        port_base: The port of the first task on each node. Defaults to 8888.
        gpus_per_task: The GPUs of each task, or ``None`` to take
            ``SLURM_GPUS_PER_TASK`` (``srun --gpus-per-task``), and to leave
            ``CUDA_VISIBLE_DEVICES`` as it is without it. Defaults to ``None``.

    Returns:
        A `SlurmTask`: the `TF_CONFIG` dict and the ``CUDA_VISIBLE_DEVICES``
        value (``None`` when the GPUs per task are not known).

    Raises:
        ValueError: If a variable is missing or ill-formed (the message names
            it and quotes its value), the variables disagree, `port_base` or
            `gpus_per_task` is invalid, or the task runs elsewhere than the
            block distribution puts it.
    """
    hosts = expand_hostlist(
        _variable(environ, "SLURM_STEP_NODELIST"), "SLURM_STEP_NODELIST"
    )
    if len(set(hosts)) != len(hosts):
        raise _ill_formed(
            "SLURM_STEP_NODELIST",
            "a list that names each node once",
            environ["SLURM_STEP_NODELIST"],
        )
    text = _variable(environ, "SLURM_STEP_TASKS_PER_NODE")
    counts = expand_tasks_per_node(text, "SLURM_STEP_TASKS_PER_NODE")
    if len(counts) != len(hosts):
        rule = f"one task count per node of SLURM_STEP_NODELIST ({len(hosts)})"
        raise _ill_formed("SLURM_STEP_TASKS_PER_NODE", rule, text)
    num_tasks = _integer(environ, "SLURM_STEP_NUM_TASKS", 1)
    if num_tasks != sum(counts):
        raise ValueError(
            "`SLURM_STEP_NUM_TASKS` must be the number of tasks that "
            f"SLURM_STEP_TASKS_PER_NODE={text!r} gives ({sum(counts)}). "
            f"Received: SLURM_STEP_NUM_TASKS={num_tasks}"
        )
    rank = _integer(environ, "SLURM_PROCID", 0)
    if rank >= num_tasks:
        raise ValueError(
            f"`SLURM_PROCID` must be in [0, {num_tasks}), one per task of "
            f"SLURM_STEP_NUM_TASKS={num_tasks}. Received: SLURM_PROCID={rank}"
        )
    highest = _MAX_PORT - max(counts) + 1
    is_int = isinstance(port_base, int) and not isinstance(port_base, bool)
    if not is_int or not 1 <= port_base <= highest:
        raise ValueError(
            f"`port_base` must be an integer in [1, {highest}] for "
            f"{max(counts)} task(s) on a node, one port each. "
            f"Received: port_base={port_base!r}"
        )
    gpus = _gpus_per_task(environ, gpus_per_task)
    tasks = [(host, i) for host, count in zip(hosts, counts) for i in range(count)]
    host, local_id = tasks[rank]
    _check_placement(environ, host, local_id)
    addresses = [f"{h}:{port_base + i}" for h, i in tasks]
    devices = None
    if gpus is not None:
        devices = ",".join(str(local_id * gpus + g) for g in range(gpus))
    return SlurmTask(tf_config_for(addresses, rank), devices)
