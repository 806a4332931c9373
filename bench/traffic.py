"""``python -m bench.traffic``: bytes each device sends and receives per step.

Every setup trains the same model in its own process on ``N`` logical CPUs.
That process runs with TensorFlow's own logging switched on
(``TF_CPP_VMODULE=log_memory=2,executor=1,ring_alg=3``), and a callback writes
a marker before and after each training step, so the runtime's records of one
step lie between two markers. The parent process reads them; nothing is
estimated from the model by hand. Two kinds of record carry bytes between
devices:

- **Send/Recv edges.** When TensorFlow partitions a step's graph over devices,
  every tensor consumed on another device than the one that made it crosses
  through a ``_Send``/``_Recv`` pair. The executor logs each node it runs with
  its device (``Process node: ... = _Recv[send_device=...] device: ...``) and
  the memory log gives each node's output tensor with its dtype and shape
  (``MemoryLogTensorOutput``). A ``_Recv`` output of ``n`` elements of ``d``
  bytes counts ``n * d`` bytes sent by ``send_device`` and received by the
  ``_Recv``'s device. These are exactly the tensors that cross a link on GPUs,
  where each pair becomes a device-to-device copy (``MemcpyDtoD`` or P2P over
  NVLink/PCIe).
- **Collective all-reduce.** Stock `MirroredStrategy`'s default on CPUs is
  `tf.distribute` ``CollectiveAllReduce`` with the RING implementation
  (``CollectiveReduceV2``, ``communication_hint="ring"``; on GPUs the default
  is NCCL, whose ring moves the same ``2 (N-1)/N`` bytes per device). Its
  copies happen inside the op, not through graph edges: the ring logs every
  chunk it sends and receives (``DispatchSend rank=r ... chunk (begin, end)``,
  ``DispatchRecv``), and ``end - begin`` is the chunk's size in bytes. Ranks
  are mapped to devices through the group's device order, which the ring logs
  too.

**Copies elided on one host.** Logical CPUs share one address space. A
``_Recv`` between two of them hands over the sender's buffer without copying
(its output has the same ``ptr`` as the sent tensor in the memory log; the
results count these bytes as ``shared_buffer_bytes``). They are counted all
the same: the graph asks for the transfer, and on GPUs it is a copy across a
link. The ring's chunk copies are real ``memcpy`` calls even on CPUs.

Not counted: the input pipeline's own copies outside the step (stock
`MirroredStrategy` prefetches each replica's shard to its device in the
background; on GPUs those come from the host over PCIe, not from device 0).
`TowerModel` cuts the global batch inside the step, so its shard copies from
the first tower's device are counted (they are the part of
``send_recv_bytes`` that is not ``variable_shaped_bytes``).

The table gives, per setup and ``N``: the most any device sent and received,
device 0's bytes, the gradient bytes ``G`` (all trainable variables), the ring
bound ``2 (N-1)/N * G`` (what each device sends, and receives, in a ring
all-reduce; no all-reduce of ``G`` can move less per device), the ratio of the
busiest direction of the busiest device to that bound, the collective ops
device 0 ran in the step (all-reduces and all-gathers), and the time that
direction takes at 12 GB/s (about what PCIe 3.0 x16 achieves) and 150 GB/s
(NVLink on a V100), both per direction: a bandwidth-only lower bound, with no
latency and no overlap with compute. 1 MB = 10^6 bytes.

Run ``python -m bench.traffic`` (all of N = 2, 4, 8 and every setup, a few
minutes); ``--quick`` measures a small model at N = 2.

This module is the driver (`measure`, `run`, the table and the command line);
`bench.traffic_worker` is the measured child process (the models and setups),
and `bench.traffic_log` reads its log (`parse_step`, `summarize`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.traffic_log import (
    NVLINK_BYTES_PER_S,
    PCIE_BYTES_PER_S,
    parse_step,
    ring_device_order,
    step_lines,
    summarize,
)
from bench.traffic_worker import (
    EMBEDDING_MODELS,
    MEASURED_STEPS,
    MODELS,
    SETUPS,
    worker,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
VMODULE = "log_memory=2,executor=1,ring_alg=3"


def measure(
    model: str, setup: str, devices: int, batch_size: int = 64, timeout: int = 900
) -> dict[str, Any]:
    """Runs one setup in a child process and reads its log.

    Args:
        model: A name in `MODELS`.
        setup: A name in `SETUPS`.
        devices: ``N``, the number of logical CPUs (towers or replicas).
        batch_size: The **global** batch size (all devices together).
            Defaults to 64.
        timeout: Seconds the child may run. Defaults to 900.

    Returns:
        The row of the last measured step (see `summarize`), with
        ``steps_agree`` (every measured step moved the same bytes per device)
        and the child's ``machine`` facts.

    Raises:
        RuntimeError: If the child fails.
    """
    if setup not in SETUPS:
        raise ValueError(f"`setup` must be one of {list(SETUPS)}. Received: {setup=}")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE=VMODULE)
    env.pop("TF_CPP_MAX_VLOG_LEVEL", None)
    command = [sys.executable, "-m", "bench.traffic", "--worker", model, setup]
    command += [str(devices), str(batch_size)]
    with tempfile.TemporaryFile("w+", errors="replace") as log:
        process = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=timeout,
        )
        log.seek(0)
        lines = log.read().splitlines()
    if process.returncode != 0:
        raise RuntimeError(
            f"The {setup} process with {devices} devices failed with exit code "
            f"{process.returncode}:\n" + "\n".join(lines[-30:])
        )
    facts = json.loads(process.stdout.strip().splitlines()[-1])
    if facts["variable_dtypes"] != ["float32"]:
        raise ValueError(
            "The traffic model must have float32 variables. Received: "
            f"{facts['variable_dtypes']}"
        )
    order = ring_device_order(lines)
    rows = [
        summarize(
            parse_step(step_lines(lines, step), order),
            facts["devices"],
            facts["variable_shapes"],
            sparse_shapes=facts["sparse_shapes"],
            row_bytes=facts["row_bytes"],
        )
        for step in MEASURED_STEPS
    ]
    row = rows[-1]
    if row["collective_ops"] and not row["ring_sent_bytes"]:
        raise RuntimeError(
            "Collective ops ran but the ring logged no chunks, so their bytes "
            f"would go uncounted. Received: collective_ops={row['collective_ops']}"
        )
    return {
        "towers": devices,
        "setup": setup,
        "description": SETUPS[setup],
        "measured_step": MEASURED_STEPS[-1],
        "steps_agree": all(r["devices"] == row["devices"] for r in rows),
        **row,
        "machine": facts["machine"],
    }


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.1f}"


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table of the module doc, one row per setup and ``N``."""
    lines = [
        "| N | setup | max sent MB | max received MB | device 0 sent MB "
        "| device 0 received MB | gradients MB | ring bound MB "
        "| busiest / ring bound | collectives | PCIe ms | NVLink ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['towers']} | {r['setup']} | {_mb(r['max_sent'])} "
            f"| {_mb(r['max_received'])} | {_mb(r['device0_sent'])} "
            f"| {_mb(r['device0_received'])} | {_mb(r['gradient_bytes'])} "
            f"| {_mb(r['ring_bound'])} | {r['ratio_to_ring_bound']:.2f} "
            f"| {r['launches']} | {r['pcie_ms']:.2f} | {r['nvlink_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _package_changes() -> list[str]:
    command = ["git", "status", "--porcelain", "--", "kerastower"]
    try:
        found = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ["(git not found)"]
    return found.stdout.splitlines()


def run(
    model: str,
    towers: Sequence[int],
    setups: Sequence[str],
    batch_size: int,
    out: Path,
    log=print,
) -> dict[str, Any]:
    """Measures every setup at every ``N`` and writes ``traffic.json`` and
    ``traffic.md`` to `out`."""
    started = time.perf_counter()
    package_changes = {"start": _package_changes()}
    rows = []
    for devices in towers:
        for setup in setups:
            log(f"[traffic] {setup} on {devices} devices")
            row = measure(model, setup, devices, batch_size)
            log(
                f"[traffic]   max sent {_mb(row['max_sent'])} MB, max received "
                f"{_mb(row['max_received'])} MB, "
                f"{row['ratio_to_ring_bound']:.2f} x ring bound"
            )
            rows.append(row)
    package_changes["end"] = _package_changes()
    machine = rows[0].pop("machine") if rows else {}
    for row in rows[1:]:
        row.pop("machine")
    results = {
        "meta": {
            "command": " ".join(["python -m bench.traffic", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "model": describe(model),
            "global_batch_size": batch_size,
            "bandwidth_bytes_per_s": {
                "pcie": PCIE_BYTES_PER_S,
                "nvlink": NVLINK_BYTES_PER_S,
            },
            "setups": {name: SETUPS[name] for name in setups},
            "method": "see the docstring of bench/traffic.py",
            "machine": machine,
            # Uncommitted changes to kerastower/ when the run started and ended.
            "kerastower_changes": package_changes,
            "seconds": time.perf_counter() - started,
        },
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(model)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown_table(rows))
    return results


def result_stem(model: str) -> str:
    """The results' file name: ``traffic`` for the MLPs, else
    ``traffic_<model>``."""
    return "traffic" if model in MODELS else f"traffic_{model}"


def describe(model: str) -> str:
    """One line on `model` for the results."""
    if model in EMBEDDING_MODELS:
        vocabulary, width, length, classes = EMBEDDING_MODELS[model]
        return (
            f"{model}: Embedding({vocabulary}, {width}) of {length} tokens, "
            f"average, Dense {width} (ReLU), Dense {classes}, float32, SGD; the "
            "table's gradient is sparse rows"
        )
    features, units, layers, classes = MODELS[model]
    return (
        f"{model}: MLP {features}-" + f"{units}-" * layers + f"{classes}"
        " (ReLU), float32, SGD"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parses the command line, measures and prints the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.traffic",
        description="bytes each device sends and receives per training step",
    )
    parser.add_argument("--towers", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument(
        "--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS)
    )
    parser.add_argument("--model", choices=[*MODELS, *EMBEDDING_MODELS], default="mlp")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="global batch size (default: 64)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the tiny model at N=2, tower and mirrored_ring only",
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        model, setup, devices, batch_size = args.worker
        worker(model, setup, int(devices), int(batch_size))
        return
    if args.quick:
        args.model, args.towers, args.setups = "tiny", [2], ["tower", "mirrored_ring"]
    results = run(
        args.model,
        args.towers,
        args.setups,
        args.batch_size,
        args.out,
        log=lambda message: print(message, file=sys.stderr, flush=True),
    )
    print(markdown_table(results["rows"]), end="")
    stem = result_stem(args.model)
    print(f"written to {args.out / stem}.json and {args.out / stem}.md")


if __name__ == "__main__":
    main()
