"""Starting worker processes: the ``kerastower launch`` command.

Plain Python: the launcher neither imports TensorFlow nor joins the cluster.
Public as `kerastower.launch`, whose docstring says what each form of
``kerastower launch`` starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence

from kerastower.workers.configs import (
    LOGICAL_DEVICES_VARIABLE,
    LOOPBACK,
    TRAINING_DONE_VARIABLE,
    evaluator_tf_config,
    free_loopback_ports,
    tf_config_for,
    towers_per_worker,
)
from kerastower.workers.group import (
    WorkerGroup,
    exit_status,
    run_group,
    say,
    signals_recorded,
)
from kerastower.workers.heartbeats import HEARTBEAT_VARIABLE
from kerastower.workers.private_network import PrivateNetwork
from kerastower.workers.slurm import DEFAULT_PORT_BASE, slurm_task

DEFAULT_GRACE_PERIOD = 10.0
# Set in every worker's environment: how many times the launcher restarted
# the workers before starting this one (0 for the first start).
RESTART_COUNT_VARIABLE = "KERASTOWER_RESTART_COUNT"
# The values of `launch`'s `network`: None picks the first that works.
NETWORKS = ("private", "host")
_EXPOSED = (
    "their TensorFlow servers accept connections on every network interface "
    "of this machine, from anyone (see the Security page of the docs)"
)
# The exit status of a worker that backed up and stopped on SIGTERM, as
# `kerastower.callbacks.BackupAndRestore` does on preemption: 128 + SIGTERM.
PREEMPTED = 128 + signal.SIGTERM


def _worker_env(config: dict, towers: int | None, restarts: int = 0) -> dict[str, str]:
    env = dict(os.environ, TF_CONFIG=json.dumps(config))
    env["PYTHONUNBUFFERED"] = "1"  # the output streams line by line
    env[RESTART_COUNT_VARIABLE] = str(restarts)
    if towers is not None:
        env[LOGICAL_DEVICES_VARIABLE] = str(towers)
    return env


def _checked_command(
    script_argv: Sequence[str], module: bool, grace_period: float
) -> list[str]:
    """The command of a worker, once the launcher's arguments are checked."""
    script_argv = list(script_argv)
    if not script_argv:
        raise ValueError("`script_argv` must name a script. Received: script_argv=[]")
    if not grace_period >= 0:
        raise ValueError(
            f"`grace_period` must be >= 0. Received: grace_period={grace_period}"
        )
    return [sys.executable, *(["-m"] if module else []), *script_argv]


def _open_network(network: str | None) -> PrivateNetwork | None:
    """The private network for `network`, or ``None`` for this machine's; says which."""
    if network not in (None, *NETWORKS):
        raise ValueError(
            f"`network` must be one of {NETWORKS} or None. "
            f"Received: network={network!r}"
        )
    if network == "host":
        say(f"the workers share this machine's network (--network host): {_EXPOSED}")
        return None
    try:
        private = PrivateNetwork.open()
    except OSError as error:
        if network == "private":
            raise OSError(
                f"`network='private'` needs a network namespace, which this "
                f"system refuses ({error}). Pass network='host' (--network host) "
                "to run the workers on this machine's network."
            ) from error
        say(f"the workers could not get a private network ({error}): {_EXPOSED}")
        return None
    say(
        "the workers run in a private network: only they reach their "
        "TensorFlow servers, and they reach no other machine (--network host "
        "to share this machine's network)"
    )
    return private


def _heartbeat_path(directory: str, index: int, restarts: int) -> str:
    """The heartbeat file of worker `index` at start `restarts`."""
    return os.path.join(directory, f"heartbeat{index}-{restarts}")


def _local_cluster(
    num_workers: int,
    counts: list[int] | None,
    restarts: int,
    done_file: str | None,
    tmp: str,
) -> tuple[list[dict[str, str]], list[str | None]]:
    """The environments and labels of one start's processes, on new ports.

    Each worker gets a heartbeat file in `tmp`. With `done_file`, the last
    process is the evaluator, told by that file that training has ended.
    """
    ports = free_loopback_ports(num_workers + (done_file is not None))
    addresses = [f"{LOOPBACK}:{port}" for port in ports]
    hosts, evaluator_host = addresses[:num_workers], None
    if done_file is not None:
        evaluator_host = addresses[-1]
    envs = [
        _worker_env(
            tf_config_for(hosts, i, evaluator_host),
            None if counts is None else counts[i],
            restarts,
        )
        for i in range(num_workers)
    ]
    for i, env in enumerate(envs):
        env[HEARTBEAT_VARIABLE] = _heartbeat_path(tmp, i, restarts)
    labels: list[str | None] = [None] * num_workers
    message = f"starting {num_workers} worker(s) on {', '.join(hosts)}"
    if counts is not None:
        message += f", towers {', '.join(map(str, counts))}"
    if done_file is not None:
        config = evaluator_tf_config(hosts, evaluator_host)
        towers = None if counts is None else counts[0]
        envs.append(_worker_env(config, towers, restarts))
        envs[-1][TRAINING_DONE_VARIABLE] = done_file
        labels.append("evaluator")
        message += f", and the evaluator on {evaluator_host}"
    say(message)
    return envs, labels


def launch(
    script_argv: Sequence[str],
    num_workers: int,
    towers: str | int | Sequence[int] | None = None,
    *,
    module: bool = False,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    max_restarts: int = 0,
    restart_preempted: bool = False,
    evaluator: bool = False,
    network: str | None = None,
) -> int:
    """Runs a script as `num_workers` local workers of one cluster.

    Each worker is ``python script args...`` (``python -m module args...``
    with `module`), with no standard input, in its own process group, and
    with this process's environment plus ``PYTHONUNBUFFERED=1``, a
    `TF_CONFIG` naming every worker on a free port of ``127.0.0.1``,
    ``KERASTOWER_RESTART_COUNT`` (0, then 1 after the first restart, ...)
    and, with `towers`, ``KERASTOWER_LOGICAL_DEVICES`` set to its number of
    towers. Their standard output and error are streamed line by line to
    this process's, each line prefixed with ``[worker i] ``.

    When a worker fails, the others get SIGTERM, then SIGKILL after
    `grace_period` seconds. With `max_restarts`, every worker is then started
    again, on new ports, up to `max_restarts` times: a script that resumes
    from `kerastower.callbacks.BackupAndRestore` goes on from its last
    backup. A worker that exits with 143 (``128 + SIGTERM``: preempted, after
    its backup) stops the job without a restart unless `restart_preempted`.
    The launcher returns 0 when every worker of the last start exits with 0,
    else the failed worker's exit status (``128 + n`` when signal ``n``
    killed it). SIGINT (Ctrl-C) or SIGTERM to the launcher stops the workers
    the same way, never restarts them, and returns ``128 + signal`` (130 for
    Ctrl-C); a second one kills them at once.

    Args:
        script_argv: The script (or module) and its arguments, passed on
            unchanged.
        num_workers: The number of worker processes.
        towers: Towers per worker: one number for all, one per worker, or
            ``None`` to leave ``KERASTOWER_LOGICAL_DEVICES`` as it is; see
            `towers_per_worker`. Defaults to ``None``.
        module: Run ``script_argv[0]`` as a module (``python -m``). Defaults
            to ``False``.
        grace_period: Seconds between SIGTERM and SIGKILL when workers are
            stopped. Defaults to 10.0.
        max_restarts: How many times to start every worker again after a
            failure. Defaults to 0.
        restart_preempted: Whether a worker's exit with 143 counts as a
            failure, to restart from. Defaults to ``False``.
        evaluator: Whether to start one more process, the cluster's
            ``"evaluator"`` task (``[evaluator]`` in the output), with the
            first worker's towers: the same script, where
            `kerastower.cluster.is_evaluator` is true, runs a
            `kerastower.evaluator.SidecarEvaluator`. Once every worker has
            exited with 0 the launcher creates the file named by its
            ``KERASTOWER_TRAINING_DONE_FILE``, on which it evaluates the
            checkpoints left and exits; the job succeeds when it exits with
            0 too. Defaults to ``False``.
        network: ``"private"``: the processes run in a network of their own
            (Linux), where they reach each other on ``127.0.0.1`` and
            nothing else reaches them, nor they anything outside it:
            TensorFlow's servers listen on every interface of the machine
            and run whatever graph they are sent, so this keeps other
            machines from reaching them. ``"host"``: they share this
            machine's network (to download data while training, say).
            ``None``: private where the system allows it, else this
            machine's network, with a line saying so. Defaults to ``None``.

    Returns:
        The exit status: 0 when every worker exits with 0.

    Raises:
        ValueError: If `script_argv` is empty, or `num_workers`, `towers`,
            `grace_period`, `max_restarts` or `network` is invalid.
        OSError: If `network` is ``"private"`` and the system cannot make a
            private network.
    """
    command = _checked_command(script_argv, module, grace_period)
    counts = towers_per_worker(towers, num_workers)
    if not (isinstance(max_restarts, int) and max_restarts >= 0):
        raise ValueError(
            f"`max_restarts` must be an integer >= 0. Received: "
            f"max_restarts={max_restarts!r}"
        )
    restarts = 0
    private = _open_network(network)
    network_closed = (
        contextlib.closing(private) if private else contextlib.nullcontext()
    )
    with (
        network_closed,
        signals_recorded() as signals,
        tempfile.TemporaryDirectory() as tmp,
    ):
        while True:
            done_file = os.path.join(tmp, f"done{restarts}") if evaluator else None
            envs, labels = _local_cluster(num_workers, counts, restarts, done_file, tmp)
            beats = [_heartbeat_path(tmp, i, restarts) for i in range(num_workers)]
            group = WorkerGroup(done_file=done_file, network=private)
            status = run_group(
                group,
                command,
                envs,
                grace_period,
                signals,
                labels,
                int(evaluator),
                beats,
            )
            if status == 0 or signals or restarts == max_restarts:
                return status
            if status == PREEMPTED and not restart_preempted:
                say("a worker was preempted (143): not restarting")
                return status
            say(
                f"restarting the {num_workers} worker(s) after exit status "
                f"{status} (restart {restarts + 1} of {max_restarts})"
            )
            restarts += 1


def launch_slurm_task(
    script_argv: Sequence[str],
    *,
    port_base: int = DEFAULT_PORT_BASE,
    gpus_per_task: int | None = None,
    towers: str | int | Sequence[int] | None = None,
    module: bool = False,
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> int:
    """Runs a script as the worker of this Slurm task, in the foreground.

    Run by every task of a job step, as ``srun kerastower launch --slurm
    train.py`` does: the worker is ``python script args...`` with this
    process's environment plus ``PYTHONUNBUFFERED=1``, the `TF_CONFIG` that
    Slurm's variables give (worker ``SLURM_PROCID`` of all the step's
    tasks, on port ``port_base + i`` for the ``i``-th task of a node, in
    Slurm's order of the nodes) and, when the GPUs per task are known,
    ``CUDA_VISIBLE_DEVICES`` set to the task's GPUs. It writes to this
    process's standard output and error, which ``srun`` collects.

    SIGINT or SIGTERM to the launcher (``scancel``, the end of the time
    limit) reaches the worker as SIGTERM, then SIGKILL after `grace_period`
    seconds; a second one kills it at once. The launcher returns the
    worker's exit status (``128 + n`` when signal ``n`` killed it), also
    after a signal.

    Args:
        script_argv: The script (or module) and its arguments, passed on
            unchanged.
        port_base: The port of the first task on each node. Defaults to 8888.
        gpus_per_task: The GPUs of each task, or ``None`` to take
            ``SLURM_GPUS_PER_TASK`` and, without it, to leave
            ``CUDA_VISIBLE_DEVICES`` as it is. Defaults to ``None``.
        towers: Towers per worker, for ``KERASTOWER_LOGICAL_DEVICES``: one
            number for all, one per Slurm task, or ``None`` to leave the
            variable as it is; see `towers_per_worker`. Defaults to ``None``.
        module: Run ``script_argv[0]`` as a module (``python -m``). Defaults
            to ``False``.
        grace_period: Seconds between SIGTERM and SIGKILL when the worker is
            stopped. Defaults to 10.0.

    Returns:
        The worker's exit status.

    Raises:
        ValueError: If `script_argv` is empty, an argument is invalid, or
            the variables that ``srun`` sets (``SLURM_PROCID``,
            ``SLURM_STEP_NUM_TASKS``, ``SLURM_STEP_NODELIST``,
            ``SLURM_STEP_TASKS_PER_NODE``) are missing or ill-formed.
    """
    command = _checked_command(script_argv, module, grace_period)
    task = slurm_task(os.environ, port_base=port_base, gpus_per_task=gpus_per_task)
    hosts = task.tf_config["cluster"]["worker"]
    index = task.tf_config["task"]["index"]
    counts = towers_per_worker(towers, len(hosts))
    config = tf_config_for(hosts, index)
    env = _worker_env(config, None if counts is None else counts[index])
    if task.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = task.cuda_visible_devices
    shown = (LOGICAL_DEVICES_VARIABLE, "CUDA_VISIBLE_DEVICES")
    settings = ", ".join(f"{name}={env[name]}" for name in shown if name in env)
    say(
        f"starting worker {index} of {len(hosts)} on {hosts[index]}"
        + (f" ({settings})" if settings else "")
    )
    group = WorkerGroup(first_index=index, streamed=False)
    with signals_recorded() as signals:
        run_group(group, command, [env], grace_period, signals)
    return exit_status(group.procs[0].returncode)
