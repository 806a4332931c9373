"""Peak resident memory (RSS) of each variant, one process per variant.

Each variant trains in its own Python process, so that no two share a peak:
the process configures the logical devices, builds and compiles the model,
fits a few epochs and reports its high-water mark ``VmHWM`` from
``/proc/self/status`` (``ru_maxrss`` where that file does not exist). A
``floor`` process only starts TensorFlow and runs one op: what any variant
pays before it builds a model. Run as ``python -m bench.memory`` it is that
child process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def probe_command(workload: str, kind: str, devices: int, steps: int) -> list[str]:
    """The command line of one child process."""
    return [
        sys.executable,
        "-m",
        "bench.memory",
        f"--workload={workload}",
        f"--kind={kind}",
        f"--devices={devices}",
        f"--steps={steps}",
    ]


def _name(probe: tuple[str, str, int]) -> str:
    workload, kind, devices = probe
    name = kind if kind in ("floor", "plain") else f"{kind}{devices}"
    return f"{workload}/{name}"


def start(
    probes: Sequence[tuple[str, str, int]], steps: int, parallel: bool = False
) -> list[tuple[tuple[str, str, int], subprocess.Popen | None]]:
    """Starts the child processes of `probes` (all of them if `parallel`).

    Args:
        probes: ``(workload, kind, devices)`` triples; kind ``"floor"`` only
            starts TensorFlow.
        steps: Steps per epoch the children train (2 epochs each).
        parallel: Start every child now (fast, for smoke runs; peaks are still
            per process); otherwise `collect` starts them one after another.
            Defaults to ``False``.

    Returns:
        Handles for `collect`.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
    )

    def launch(probe):
        return subprocess.Popen(
            probe_command(*probe, steps=steps),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    return [(probe, launch(probe) if parallel else launch) for probe in probes]


def collect(handles, log=print) -> dict[str, Any]:
    """Waits for the children that `start` made and reads their peak RSS.

    Returns:
        ``{"<workload>/<variant>": {"peak_rss_mib": ...} or {"error": ...}}``.
    """
    results = {}
    for probe, handle in handles:
        process = handle if isinstance(handle, subprocess.Popen) else handle(probe)
        out, err = process.communicate(timeout=600)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if process.returncode or not lines:
            tail = (err.strip().splitlines() or ["no output"])[-1][:300]
            result = {"error": f"exit {process.returncode}: {tail}"}
        else:
            result = json.loads(lines[-1])
        results[_name(probe)] = result
        log(f"  {_name(probe):>22}: {result}")
    return results


def _child(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)

    import kerastower

    kerastower.configure_logical_devices(4)
    import tensorflow as tf

    from bench.workloads import WORKLOADS, Variant, build_variant

    if args.kind == "floor":
        float(tf.reduce_sum(tf.ones((4,))))
    else:
        workload = WORKLOADS[args.workload]
        x, y = workload.data(args.steps)
        model = build_variant(workload, Variant(args.kind, args.devices))
        model.fit(
            x, y, batch_size=workload.batch_size, epochs=2, shuffle=False, verbose=0
        )
    print(json.dumps({"peak_rss_mib": peak_rss_mib()}))


if __name__ == "__main__":
    _child()
