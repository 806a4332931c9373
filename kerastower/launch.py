"""Starting worker processes: the ``kerastower launch`` command.

``kerastower launch -n 2 --towers 2 train.py --epochs 3`` starts two local
workers, each ``python train.py --epochs 3`` with its own `TF_CONFIG` (free
ports on ``127.0.0.1``) and ``KERASTOWER_LOGICAL_DEVICES=2`` (the logical CPUs
kerastower makes on a machine without a GPU), and streams their output with
each line prefixed ``[worker i]``. The first failure stops the other workers;
Ctrl-C reaches them as SIGTERM. ``kerastower launch --hosts a:2222,b:2222
--index 0`` starts nothing: it prints worker 0's `TF_CONFIG`. Under Slurm,
``srun kerastower launch --slurm train.py`` runs one worker per Slurm task,
with the `TF_CONFIG` that the task's environment gives (`launch_slurm_task`).
The launcher is plain Python: it neither imports TensorFlow nor joins the
cluster.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from kerastower.slurm import DEFAULT_PORT_BASE, slurm_task
from kerastower.worker_configs import (
    LOGICAL_DEVICES_VARIABLE,
    LOOPBACK,
    free_loopback_ports,
    tf_config_for,
    towers_per_worker,
)

__all__ = [
    "LOOPBACK",
    "free_loopback_ports",
    "launch",
    "launch_slurm_task",
    "tf_config_for",
    "towers_per_worker",
]

DEFAULT_GRACE_PERIOD = 10.0
_POLL_SECONDS = 0.05
_POSIX = os.name == "posix"
_KILL = signal.SIGKILL if _POSIX else signal.SIGTERM
_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1


def _worker_env(hosts: list[str], index: int, towers: int | None) -> dict[str, str]:
    env = dict(os.environ, TF_CONFIG=json.dumps(tf_config_for(hosts, index)))
    env["PYTHONUNBUFFERED"] = "1"  # the output streams line by line
    if towers is not None:
        env[LOGICAL_DEVICES_VARIABLE] = str(towers)
    return env


def _exit_status(returncode: int) -> int:
    """The status a shell shows for a return code: 128 + n for signal n."""
    return 128 - returncode if returncode < 0 else returncode


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def _say(message: str) -> None:
    sys.stderr.write(f"kerastower launch: {message}\n")  # one write: one line
    sys.stderr.flush()


def _pump(pipe: Any, prefix: str, stream_name: str, lock: threading.Lock) -> None:
    """Copies a child's pipe line by line to ``sys.<stream_name>``, prefixed."""
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = prefix + raw.decode(errors="replace").rstrip("\r\n") + "\n"
            with lock:
                stream: TextIO = getattr(sys, stream_name)
                stream.write(line)
                stream.flush()


def _send(proc: subprocess.Popen, sig: int) -> None:
    """Signals a worker and whatever it started (its own process group)."""
    if proc.poll() is not None:
        return
    try:
        if _POSIX:
            os.killpg(proc.pid, sig)
        else:
            proc.terminate()
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def _signals_recorded() -> Iterator[list[int]]:
    """Records SIGINT and SIGTERM instead of acting on them, in the main thread."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda signum, _: received.append(signum))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _die_with(launcher_pid: int) -> None:
    """In a new worker (Linux): SIGTERM when the launcher dies, even by SIGKILL.

    Without it, a launcher killed outright would leave its workers running,
    each in a session of its own.
    """
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


class _Workers:
    """The running worker processes and the threads that stream their output.

    Args:
        first_index: The index of the first worker, in messages and prefixes.
        streamed: Whether the workers' output is streamed, line by line and
            prefixed; if not, they write to this process's output directly.
    """

    def __init__(self, first_index: int = 0, streamed: bool = True):
        self.first_index = first_index
        self.streamed = streamed
        self.procs: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(self, command: list[str], env: dict[str, str]) -> None:
        # Its own session: Ctrl-C at a terminal reaches the launcher only,
        # which gives the workers SIGTERM and time to save a checkpoint.
        output = subprocess.PIPE if self.streamed else None
        proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=_POSIX,
            preexec_fn=functools.partial(_die_with, os.getpid()) if _LINUX else None,
        )
        prefix = f"[worker {self.first_index + len(self.procs)}] "
        self.procs.append(proc)
        if not self.streamed:
            return
        for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            args = (pipe, prefix, name, self.lock)
            self.threads.append(threading.Thread(target=_pump, args=args, daemon=True))
            self.threads[-1].start()

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def names(self, positions: Sequence[int]) -> str:
        """The workers at `positions` of `procs`, as messages name them."""
        return _join([self.first_index + i for i in positions])

    def stop(self, grace_period: float, signals: list[int]) -> list[int]:
        """SIGTERM to every running worker, SIGKILL after the grace period.

        A further signal to the launcher ends the grace period at once.

        Returns:
            The indices of the workers that had to be killed.
        """
        seen = len(signals)
        for i in self.running():
            _send(self.procs[i], signal.SIGTERM)
        deadline = time.monotonic() + grace_period
        while self.running() and time.monotonic() < deadline and len(signals) == seen:
            time.sleep(_POLL_SECONDS)
        killed = self.running()
        for i in killed:
            _send(self.procs[i], _KILL)
        for proc in self.procs:
            proc.wait()
        return killed

    def wait(self, grace_period: float, signals: list[int]) -> int:
        """Waits for every worker to succeed, or for the first failure or signal."""
        while not signals:
            # One poll per worker per round: a worker that ends between two
            # polls must not look finished without its status being read.
            codes = [p.poll() for p in self.procs]
            failed = [p for p, code in zip(self.procs, codes) if code not in (None, 0)]
            if failed:
                i, others = self.procs.index(failed[0]), self.running()
                killed = self.stop(grace_period, signals)
                _say(
                    f"worker {self.names([i])} {_describe_exit(failed[0].returncode)}"
                    + ("; stopped the others" if others else "")
                    + (f" (killed worker(s) {self.names(killed)})" if killed else "")
                )
                return _exit_status(failed[0].returncode)
            if None not in codes:
                return 0
            time.sleep(_POLL_SECONDS)
        _say(
            f"{signal.Signals(signals[0]).name} received; stopping the workers "
            f"(SIGTERM, then SIGKILL after {grace_period:g} s)"
        )
        killed = self.stop(grace_period, signals)
        if killed:
            _say(f"killed worker(s) {self.names(killed)}")
        return 128 + signals[0]

    def close(self) -> None:
        """Kills what still runs (after an error in the launcher); ends the output."""
        for proc in self.procs:
            _send(proc, _KILL)
            proc.wait()
        deadline = time.monotonic() + 2.0
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def _join(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


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


def _run(
    workers: _Workers,
    command: list[str],
    envs: list[dict[str, str]],
    grace_period: float,
) -> int:
    """Starts a worker per environment and waits for them; see `launch`."""
    with _signals_recorded() as signals:
        try:
            for env in envs:
                workers.start(command, env)
            return workers.wait(grace_period, signals)
        finally:
            workers.close()


def launch(
    script_argv: Sequence[str],
    num_workers: int,
    towers: str | int | Sequence[int] | None = None,
    *,
    module: bool = False,
    grace_period: float = DEFAULT_GRACE_PERIOD,
) -> int:
    """Runs a script as `num_workers` local workers of one cluster.

    Each worker is ``python script args...`` (``python -m module args...``
    with `module`), with no standard input, in its own process group, and
    with this process's environment plus ``PYTHONUNBUFFERED=1``, a
    `TF_CONFIG` naming every worker on a free port of ``127.0.0.1`` and, with
    `towers`, ``KERASTOWER_LOGICAL_DEVICES`` set to its number of towers.
    Their standard output and error are streamed line by line to this
    process's, each line prefixed with ``[worker i] ``.

    When a worker fails, the others get SIGTERM, then SIGKILL after
    `grace_period` seconds, and the launcher returns the failed worker's exit
    status (``128 + n`` when signal ``n`` killed it). SIGINT (Ctrl-C) or
    SIGTERM to the launcher stops the workers the same way and returns
    ``128 + signal`` (130 for Ctrl-C); a second one kills them at once.

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

    Returns:
        The exit status: 0 when every worker exits with 0.

    Raises:
        ValueError: If `script_argv` is empty, or `num_workers`, `towers` or
            `grace_period` is invalid.
    """
    command = _checked_command(script_argv, module, grace_period)
    counts = towers_per_worker(towers, num_workers)
    hosts = [f"{LOOPBACK}:{port}" for port in free_loopback_ports(num_workers)]
    envs = [
        _worker_env(hosts, i, None if counts is None else counts[i])
        for i in range(num_workers)
    ]
    _say(
        f"starting {num_workers} worker(s) on {', '.join(hosts)}"
        + ("" if counts is None else f", towers {_join(counts)}")
    )
    return _run(_Workers(), command, envs, grace_period)


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
    `kerastower.slurm.slurm_task` reads from Slurm's variables (worker
    ``SLURM_PROCID`` of all the step's tasks, on port ``port_base + i`` for
    the ``i``-th task of a node) and, when the GPUs per task are known,
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
            Slurm's variables are missing or ill-formed (see `slurm_task`).
    """
    command = _checked_command(script_argv, module, grace_period)
    task = slurm_task(os.environ, port_base=port_base, gpus_per_task=gpus_per_task)
    hosts = task.tf_config["cluster"]["worker"]
    index = task.tf_config["task"]["index"]
    counts = towers_per_worker(towers, len(hosts))
    env = _worker_env(hosts, index, None if counts is None else counts[index])
    if task.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = task.cuda_visible_devices
    shown = (LOGICAL_DEVICES_VARIABLE, "CUDA_VISIBLE_DEVICES")
    settings = ", ".join(f"{name}={env[name]}" for name in shown if name in env)
    _say(
        f"starting worker {index} of {len(hosts)} on {hosts[index]}"
        + (f" ({settings})" if settings else "")
    )
    workers = _Workers(first_index=index, streamed=False)
    _run(workers, command, [env], grace_period)
    return _exit_status(workers.procs[0].returncode)
