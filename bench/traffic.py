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
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
VMODULE = "log_memory=2,executor=1,ring_alg=3"
MARKER = "=====kerastower-traffic"
PCIE_BYTES_PER_S = 12e9
NVLINK_BYTES_PER_S = 150e9
MEASURED_STEPS = (1, 2)

# name: (input features, hidden units, hidden layers, classes)
MODELS = {
    "mlp": (1024, 1024, 3, 10),
    "tiny": (64, 256, 2, 10),
}
# name: (vocabulary, embedding width, tokens per example, classes): a table
# whose gradient is sparse rows (`tf.IndexedSlices`), a small dense head.
EMBEDDING_MODELS = {"embedding": (20_000, 64, 32, 10)}
INDEX_BYTES = 8  # the rows' indices travel as int64
SETUPS = {
    "tower": "kerastower.TowerModel.from_model(model, towers=N)",
    "tower_replicas": "kerastower.TowerModel.from_model(model, towers=N, "
    "replicate_variables=True): per-tower replicas, ring all-reduce",
    "tower_replicas_buckets": "tower_replicas with "
    "all_reduce=kerastower.AllReduceOptions(bucket_mb=2): an all-reduce per "
    "bucket of at most 2 MB of gradients",
    "tower_replicas_accumulate": "tower_replicas with "
    "kerastower.callbacks.GradientAccumulation(2, 'carry'): measured step 1 "
    "applies a window, step 2 only accumulates",
    "tower_replicas_own_step": "tower_replicas with a train_step of its own "
    "(self.tower_gradients, then self.optimizer.apply_gradients): each step "
    "also copies the weights to the replicas through the ring",
    "mirrored_ring": "tf.distribute.MirroredStrategy(devices): default "
    "cross-device ops, CollectiveAllReduce with the RING implementation on CPUs",
    "mirrored_one": "tf.distribute.MirroredStrategy(devices, "
    "cross_device_ops=tf.distribute.ReductionToOneDevice())",
    "mirrored_hier": "tf.distribute.MirroredStrategy(devices, "
    "cross_device_ops=tf.distribute.HierarchicalCopyAllReduce())",
}
DTYPE_BYTES = {
    "DT_BOOL": 1, "DT_INT8": 1, "DT_UINT8": 1, "DT_INT16": 2, "DT_UINT16": 2,
    "DT_HALF": 2, "DT_BFLOAT16": 2, "DT_FLOAT": 4, "DT_INT32": 4, "DT_UINT32": 4,
    "DT_DOUBLE": 8, "DT_INT64": 8, "DT_UINT64": 8, "DT_COMPLEX64": 8,
    "DT_COMPLEX128": 16,
}  # fmt: skip

_PROCESS = re.compile(
    r"Process node: \d+ step (?P<step>-?\d+) \{\{node (?P<node>[^}]+)\}\} = "
    r"(?P<op>\w+)\[(?P<attrs>.*)\]\(.*\) device: (?P<device>\S+)\s*$"
)
_MEMORY = re.compile(
    r"MemoryLogTensorOutput \{.*?step_id: (?P<step>-?\d+) "
    r'kernel_name: "(?P<node>[^"]+)".*? tensor \{ dtype: (?P<dtype>\w+) '
    r"shape \{(?P<shape>(?:[^{}]|\{[^{}]*\})*)\}.*?ptr: (?P<ptr>\d+)"
)
_RING = re.compile(
    r"Dispatch(?P<way>Send|Recv) rank=(?P<rank>\d+) \w+ key \S+ "
    r"chunk \((?P<begin>\d+), (?P<end>\d+)\)"
)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Bytes that one device sent to another in the measured step.

    Attributes:
        source: The sending device.
        destination: The receiving device, or ``"ring"`` for a ring chunk
            whose receiver is counted by its own record.
        nbytes: The tensor's (or chunk's) size in bytes.
        kind: ``"send_recv"`` (a graph edge) or ``"ring_send"`` /
            ``"ring_recv"`` (a collective's chunk).
        shape: The tensor's shape; empty for ring chunks.
        shared_buffer: Whether the receiver got the sender's buffer without a
            copy (Send/Recv on one host), ``None`` for ring chunks.
    """

    source: str
    destination: str
    nbytes: int
    kind: str
    shape: tuple[int, ...] = ()
    shared_buffer: bool | None = None


def short_device(name: str) -> str:
    """``"CPU:1"`` for ``"/job:localhost/replica:0/task:0/device:CPU:1"``."""
    return name.rsplit("device:", 1)[-1]


def step_lines(lines: Sequence[str], step: int) -> list[str]:
    """The log lines between the markers of training step `step`."""
    begin, end = f"{MARKER} begin {step}", f"{MARKER} end {step}"
    stripped = [line.strip() for line in lines]
    if begin not in stripped or end not in stripped:
        raise ValueError(
            f"The log has no markers of step {step}. Received: "
            f"{len(lines)} lines, the last one {lines[-1:]!r}"
        )
    return list(lines[stripped.index(begin) + 1 : stripped.index(end)])


def ring_device_order(lines: Iterable[str]) -> list[str]:
    """The devices in rank order of the ring collectives in `lines`.

    Raises:
        ValueError: If the log names more than one ring order.
    """
    orders, current = set(), None
    for line in lines:
        if "device order:" in line:
            current = []
        elif current is not None and line.startswith("/job:"):
            current.append(short_device(line.strip()))
        elif current is not None:
            orders.add(tuple(current))
            current = None
    if len(orders) > 1:
        raise ValueError(
            "Ring collectives over several device groups cannot be mapped "
            f"to devices by rank. Received: orders={sorted(orders)}"
        )
    return list(next(iter(orders), ()))


def parse_step(lines: Sequence[str], ring_order: Sequence[str] = ()) -> dict:
    """Every transfer between devices that the runtime logged in `lines`.

    Args:
        lines: One step's log lines (see `step_lines`).
        ring_order: The ring's devices in rank order (see
            `ring_device_order`); needed only when `lines` hold ring chunks.

    Returns:
        ``{"transfers": [Transfer], "collective_ops": Counter of (op, device),
        "data_free_recvs": int, "unsized_recvs": {dtype: count}}``. A
        ``_Recv`` with no output in the memory log carries only a control edge;
        one of a dtype without a fixed size (resource handles, variants) is
        counted as 0 bytes under ``unsized_recvs``.
    """
    recvs = collections.defaultdict(list)
    outputs = collections.defaultdict(list)
    device_of, collectives = {}, collections.Counter()
    ring = []
    for line in lines:
        if match := _PROCESS.search(line):
            key = (match["step"], match["node"])
            device_of[key] = short_device(match["device"])
            if match["op"] in ("_Recv", "_HostRecv"):
                sender = re.search(r'send_device="([^"]+)"', match["attrs"])[1]
                recvs[key].append(short_device(sender))
            elif match["op"].startswith(("Collective", "Nccl")):
                collectives[(match["op"], device_of[key])] += 1
        elif match := _MEMORY.search(line):
            shape = tuple(int(d) for d in re.findall(r"size: (\d+)", match["shape"]))
            outputs[(match["step"], match["node"])].append(
                (match["dtype"], shape, int(match["ptr"]))
            )
        elif match := _RING.search(line):
            ring.append(match)
    pointers = collections.defaultdict(set)
    for key, produced in outputs.items():
        if key in device_of and key not in recvs:
            pointers[(key[0], device_of[key])].update(ptr for *_, ptr in produced)
    transfers, data_free, unsized = [], 0, collections.Counter()
    for key, senders in recvs.items():
        produced = outputs.get(key, [])
        data_free += len(senders) - len(produced)
        for sender, (dtype, shape, ptr) in zip(senders, produced):
            if dtype not in DTYPE_BYTES:
                unsized[dtype] += 1
            transfers.append(
                Transfer(
                    source=sender,
                    destination=device_of[key],
                    nbytes=_elements(shape) * DTYPE_BYTES.get(dtype, 0),
                    kind="send_recv",
                    shape=shape,
                    shared_buffer=ptr in pointers[(key[0], sender)],
                )
            )
    for match in ring:
        rank = int(match["rank"])
        if rank >= len(ring_order):
            raise ValueError(
                f"The ring chunk of rank {rank} has no device. Received: "
                f"ring_order={list(ring_order)}"
            )
        way = match["way"].lower()
        transfers.append(
            Transfer(
                source=ring_order[rank] if way == "send" else "ring",
                destination=ring_order[rank] if way == "recv" else "ring",
                nbytes=int(match["end"]) - int(match["begin"]),
                kind=f"ring_{way}",
            )
        )
    return {
        "transfers": transfers,
        "collective_ops": collectives,
        "data_free_recvs": data_free,
        "unsized_recvs": dict(unsized),
    }


def per_device(transfers: Iterable[Transfer], devices: Sequence[str]) -> dict:
    """``{device: {"sent": bytes, "received": bytes}}`` for every device."""
    totals = {device: {"sent": 0, "received": 0} for device in devices}
    for transfer in transfers:
        if transfer.source in totals:
            totals[transfer.source]["sent"] += transfer.nbytes
        if transfer.destination in totals:
            totals[transfer.destination]["received"] += transfer.nbytes
    return totals


def ring_bound(devices: int, gradient_bytes: int, row_bytes: int = 0) -> float:
    """Bytes each device sends (and receives) in a ring all-reduce of the
    dense gradients and a ring all-gather of the sparse rows:
    ``2 (N-1)/N * gradient_bytes + (N-1)/N * row_bytes``."""
    return (devices - 1) / devices * (2 * gradient_bytes + row_bytes)


def summarize(
    parsed: dict,
    devices: Sequence[str],
    variable_shapes: Sequence[Sequence[int]],
    dtype_bytes: int = 4,
    sparse_shapes: Sequence[Sequence[int]] = (),
    row_bytes: int = 0,
) -> dict[str, Any]:
    """One row of the table from `parse_step`'s records (see the module doc).

    Args:
        parsed: What `parse_step` returned for the measured step.
        devices: The ``N`` devices, device 0 first (short names, ``"CPU:0"``).
        variable_shapes: The shapes of the model's trainable variables.
        dtype_bytes: Bytes per element of the variables. Defaults to 4.
        sparse_shapes: The shapes among `variable_shapes` whose gradients are
            sparse rows: they count as `row_bytes`, not as dense gradients.
        row_bytes: The bytes of one step's sparse rows, all towers' values
            and indices.
    """
    transfers = parsed["transfers"]
    totals = per_device(transfers, devices)
    dense = list(variable_shapes)
    for shape in sparse_shapes:
        dense.remove(list(shape))
    gradient_bytes = dtype_bytes * sum(_elements(s) for s in dense)
    bound = ring_bound(len(devices), gradient_bytes, row_bytes)
    busiest = max(max(t["sent"], t["received"]) for t in totals.values())
    edges = [t for t in transfers if t.kind == "send_recv"]
    model_shapes = {tuple(s) for s in variable_shapes}
    packed = sum(_elements(s) for s in variable_shapes)
    grouped = collections.Counter()
    for t in transfers:
        grouped[(t.source, t.destination, t.kind, t.shape)] += t.nbytes
    return {
        "devices": [{"device": d, **totals[d]} for d in devices],
        "max_sent": max(t["sent"] for t in totals.values()),
        "max_received": max(t["received"] for t in totals.values()),
        "device0_sent": totals[devices[0]]["sent"],
        "device0_received": totals[devices[0]]["received"],
        "gradient_bytes": gradient_bytes,
        "row_bytes": row_bytes,
        "ring_bound": bound,
        "ratio_to_ring_bound": busiest / bound if bound else None,
        "pcie_ms": 1e3 * busiest / PCIE_BYTES_PER_S,
        "nvlink_ms": 1e3 * busiest / NVLINK_BYTES_PER_S,
        "send_recv_bytes": sum(t.nbytes for t in edges),
        # Weights and gradients, one variable at a time or packed into one.
        "variable_shaped_bytes": sum(
            t.nbytes for t in edges if t.shape in model_shapes or t.shape == (packed,)
        ),
        "shared_buffer_bytes": sum(t.nbytes for t in edges if t.shared_buffer),
        "ring_sent_bytes": sum(t.nbytes for t in transfers if t.kind == "ring_send"),
        "ring_received_bytes": sum(
            t.nbytes for t in transfers if t.kind == "ring_recv"
        ),
        "launches": sum(
            count
            for (_, device), count in parsed["collective_ops"].items()
            if device == devices[0]
        ),
        "collective_ops": [
            {"op": op, "device": device, "count": count}
            for (op, device), count in sorted(parsed["collective_ops"].items())
        ],
        "data_free_recvs": parsed["data_free_recvs"],
        "unsized_recvs": parsed["unsized_recvs"],
        "transfers": [
            {"source": s, "destination": d, "kind": k, "shape": list(shape), "bytes": b}
            for (s, d, k, shape), b in sorted(grouped.items())
        ],
    }


def _elements(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


# -- The measured process -------------------------------------------------------


def _build(name: str):
    import keras

    if name in EMBEDDING_MODELS:
        vocabulary, width, length, classes = EMBEDDING_MODELS[name]
        keras.utils.set_random_seed(0)
        inputs = keras.Input((length,), dtype="int32")
        hidden = keras.layers.Embedding(vocabulary, width)(inputs)
        hidden = keras.layers.GlobalAveragePooling1D()(hidden)
        hidden = keras.layers.Dense(width, activation="relu")(hidden)
        return keras.Model(inputs, keras.layers.Dense(classes)(hidden), name=name)
    features, units, layers, classes = MODELS[name]
    keras.utils.set_random_seed(0)
    inputs = keras.Input((features,))
    hidden = inputs
    for _ in range(layers):
        hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(classes)(hidden), name=name)


def _worker(model_name: str, setup: str, devices: int, batch_size: int) -> None:
    """Fits a few steps with markers around each; prints facts as JSON."""
    import kerastower

    kerastower.configure_logical_devices(devices)

    import keras
    import numpy as np
    import tensorflow as tf

    from bench.report import machine_info

    names = [d.name for d in tf.config.list_logical_devices("CPU")[:devices]]

    def compiled(model):
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    class OwnStep(kerastower.TowerModel):
        def train_step(self, data):
            x, y = data

            def loss_fn(x, y):
                return self.compute_loss(x, y, self(x, training=True))

            variables = self.trainable_variables
            grads, loss = self.tower_gradients(loss_fn, variables, x, y)
            self.optimizer.apply_gradients(zip(grads, variables))
            return {"loss": loss}

    callbacks = []
    if setup.startswith("tower"):
        towered = OwnStep if setup.endswith("_own_step") else kerastower.TowerModel
        model = compiled(
            towered.from_model(
                _build(model_name),
                towers=devices,
                replicate_variables=setup.startswith("tower_replicas"),
                all_reduce=kerastower.AllReduceOptions(
                    bucket_mb=2 if setup.endswith("_buckets") else 25
                ),
            )
        )
        if setup.endswith("_accumulate"):
            callbacks.append(kerastower.callbacks.GradientAccumulation(2, "carry"))
    else:
        cross_device_ops = {
            "mirrored_ring": None,
            "mirrored_one": tf.distribute.ReductionToOneDevice(),
            "mirrored_hier": tf.distribute.HierarchicalCopyAllReduce(),
        }[setup]
        strategy = tf.distribute.MirroredStrategy(
            names, cross_device_ops=cross_device_ops
        )
        with strategy.scope():
            model = compiled(_build(model_name))

    class Markers(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            os.write(2, f"\n{MARKER} begin {batch}\n".encode())

        def on_train_batch_end(self, batch, logs=None):
            os.write(2, f"\n{MARKER} end {batch}\n".encode())

    examples = (max(MEASURED_STEPS) + 1) * batch_size
    rng = np.random.default_rng(0)
    sparse_shapes, row_bytes = [], 0
    if model_name in EMBEDDING_MODELS:
        vocabulary, width, length, classes = EMBEDDING_MODELS[model_name]
        x = rng.integers(0, vocabulary, size=(examples, length)).astype("int32")
        sparse_shapes = [[vocabulary, width]]
        row_bytes = batch_size * length * (4 * width + INDEX_BYTES)
    else:
        features, _, _, classes = MODELS[model_name]
        x = rng.normal(size=(examples, features)).astype("float32")
    y = rng.integers(0, classes, size=(examples,)).astype("int32")
    model.fit(
        x,
        y,
        batch_size=batch_size,
        shuffle=False,
        verbose=0,
        callbacks=[*callbacks, Markers()],
    )
    facts = {
        "devices": [short_device(name) for name in names],
        "variable_shapes": [list(v.shape) for v in model.trainable_variables],
        "variable_dtypes": sorted({str(v.dtype) for v in model.trainable_variables}),
        "sparse_shapes": sparse_shapes,
        "row_bytes": row_bytes,
        "machine": machine_info(),
    }
    print(json.dumps(facts))


# -- The driver -------------------------------------------------------------------


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
        _worker(model, setup, int(devices), int(batch_size))
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
