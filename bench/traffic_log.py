"""The runtime's log of one training step, read into bytes between devices.

`bench.traffic` runs each setup in a child process (`bench.traffic_worker`)
with TensorFlow's executor, memory and ring logs switched on; this module reads
that log: the lines between one step's markers (`step_lines`), every
``_Send``/``_Recv`` edge and ring chunk in them (`parse_step`), and the row of
the table they add up to (`summarize`). The method is in the docstring of
`bench.traffic`.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

MARKER = "=====kerastower-traffic"
PCIE_BYTES_PER_S = 12e9
NVLINK_BYTES_PER_S = 150e9
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
