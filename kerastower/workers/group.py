"""A group of local worker processes: start, stream, stop, wait.

The machinery behind `kerastower.launch`: each worker runs in its own process
group and session (Ctrl-C at a terminal reaches the launcher only), dies
with the launcher on Linux, and has its output copied line by line with a
``[worker i]`` prefix. The first failure stops the others: SIGTERM, then
SIGKILL after a grace period. Plain Python, no TensorFlow.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from kerastower.workers.heartbeats import describe
from kerastower.workers.private_network import PrivateNetwork

_POLL_SECONDS = 0.05
_POSIX = os.name == "posix"
_KILL = signal.SIGKILL if _POSIX else signal.SIGTERM
_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1


def exit_status(returncode: int) -> int:
    """The status a shell shows for a return code: 128 + n for signal n."""
    return 128 - returncode if returncode < 0 else returncode


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def say(message: str) -> None:
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
def signals_recorded() -> Iterator[list[int]]:
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


def _die_with(launcher_pid: int, network: PrivateNetwork | None) -> None:
    """In a new worker (Linux): SIGTERM when the launcher dies, even by SIGKILL.

    Without it, a launcher killed outright would leave its workers running,
    each in a session of its own. With `network`, the worker joins it.
    """
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
    if network is not None:
        network.join()


class WorkerGroup:
    """The running worker processes and the threads that stream their output.

    Args:
        first_index: The index of the first worker, in messages and prefixes.
        streamed: Whether the workers' output is streamed, line by line and
            prefixed; if not, they write to this process's output directly.
        done_file: A file created once every process but the sidecars has
            exited with 0, or ``None``.
        network: The private network the processes join (Linux), or ``None``
            for this machine's network.
    """

    def __init__(
        self,
        first_index: int = 0,
        streamed: bool = True,
        done_file: str | None = None,
        network: PrivateNetwork | None = None,
    ):
        self.first_index = first_index
        self.network = network
        self.done_file = done_file
        self.streamed = streamed
        self.procs: list[subprocess.Popen] = []
        self.labels: list[str] = []
        self.sidecars: list[bool] = []
        self.heartbeats: list[str | None] = []
        self.sidecars_told = False
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(
        self,
        command: list[str],
        env: dict[str, str],
        label: str | None = None,
        sidecar: bool = False,
        heartbeat: str | None = None,
    ) -> None:
        """Starts a process; `label` names it (default: ``worker <index>``).

        A `sidecar` (the evaluator) is told once every other process has
        exited with 0 (see `done_file`), and the group then waits for it.
        The `heartbeat` file (`kerastower.workers.heartbeats`) says what the
        process was doing last when the group stops after a failure.
        """
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
            preexec_fn=(
                functools.partial(_die_with, os.getpid(), self.network)
                if _LINUX
                else None
            ),
        )
        label = self.track(proc, label, sidecar, heartbeat)
        if not self.streamed:
            return
        for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            args = (pipe, f"[{label}] ", name, self.lock)
            self.threads.append(threading.Thread(target=_pump, args=args, daemon=True))
            self.threads[-1].start()

    def track(
        self,
        proc: subprocess.Popen,
        label: str | None = None,
        sidecar: bool = False,
        heartbeat: str | None = None,
    ) -> str:
        """Adds a started process to the group; returns its label."""
        label = label or f"worker {self.first_index + len(self.procs)}"
        self.procs.append(proc)
        self.labels.append(label)
        self.sidecars.append(sidecar)
        self.heartbeats.append(heartbeat)
        return label

    def report_last_steps(self) -> None:
        """Says what each process with a heartbeat file was doing last."""
        for label, path in zip(self.labels, self.heartbeats):
            if path is not None:
                last = describe(path) or "had not begun a batch of fit"
                say(f"{label} was last {last}")

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def names(self, positions: Sequence[int]) -> str:
        """The processes at `positions` of `procs`, as messages name them."""
        return ", ".join(self.labels[i] for i in positions)

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
                say(
                    f"{self.names([i])} {_describe_exit(failed[0].returncode)}"
                    + ("; stopped the others" if others else "")
                    + (f" (killed {self.names(killed)})" if killed else "")
                )
                self.report_last_steps()
                return exit_status(failed[0].returncode)
            if None not in codes:
                return 0
            mains_done = all(
                code == 0 for code, side in zip(codes, self.sidecars) if not side
            )
            if mains_done and not self.sidecars_told:
                self.sidecars_told = True
                if self.done_file is not None:
                    open(self.done_file, "w").close()
            time.sleep(_POLL_SECONDS)
        say(
            f"{signal.Signals(signals[0]).name} received; stopping the workers "
            f"(SIGTERM, then SIGKILL after {grace_period:g} s)"
        )
        killed = self.stop(grace_period, signals)
        if killed:
            say(f"killed {self.names(killed)}")
        return 128 + signals[0]

    def close(self) -> None:
        """Kills what still runs (after an error in the launcher); ends the output."""
        for proc in self.procs:
            _send(proc, _KILL)
            proc.wait()
        deadline = time.monotonic() + 2.0
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def run_group(
    group: WorkerGroup,
    command: list[str],
    envs: list[dict[str, str]],
    grace_period: float,
    signals: list[int],
    labels: Sequence[str | None] = (),
    sidecars: int = 0,
    heartbeats: Sequence[str | None] = (),
) -> int:
    """Starts a process of `group` per environment and waits for them.

    `labels` name the processes, in order (default: ``worker <index>``); the
    last `sidecars` of them are sidecars, and `heartbeats` are their
    heartbeat files (see `WorkerGroup.start`).

    Returns:
        0 when every worker exits with 0; else the first failed worker's
        exit status, or ``128 + n`` for the first signal ``n`` in `signals`
        (see `WorkerGroup.wait`).
    """
    try:
        for i, env in enumerate(envs):
            label = labels[i] if i < len(labels) else None
            heartbeat = heartbeats[i] if i < len(heartbeats) else None
            sidecar = i >= len(envs) - sidecars
            group.start(command, env, label, sidecar, heartbeat)
        return group.wait(grace_period, signals)
    finally:
        group.close()
