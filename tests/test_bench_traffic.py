"""``python -m bench.traffic``: its log parsing, and a small measured run."""

import json
import sys
from pathlib import Path

import pytest
from bench_runner import run_bench

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.traffic_log import (  # noqa: E402
    parse_step,
    per_device,
    ring_bound,
    ring_device_order,
    step_lines,
    summarize,
)
from bench.traffic_worker import MODELS  # noqa: E402

JOB = "/job:localhost/replica:0/task:0/device:"
PREFIX = "I0000 00:00:1795450078.232938   16079 "


def _process(node, op, device, sender=None):
    attrs = f'_dst="mul", _src="w", send_device="{JOB}{sender}"' if sender else "x=1"
    return (
        f"{PREFIX}executor.cc:879] Process node: 13 step -82 {{{{node {node}}}}} "
        f'= {op}[{attrs}, _device="{JOB}{device}"](a) device: {JOB}{device}'
    )


def _output(node, dims, ptr, dtype="DT_FLOAT"):
    shape = " ".join(f"dim {{ size: {d} }}" for d in dims)
    return (
        f"{PREFIX}log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorOutput {{ "
        f'step_id: -82 kernel_name: "{node}" tensor {{ dtype: {dtype} shape {{ '
        f"{shape} }} allocation_description {{ requested_bytes: 4 "
        f'allocator_name: "mklcpu" allocation_id: 5 ptr: {ptr} }} }} }}'
    )


def _ring(way, rank, begin, end):
    word = "send" if way == "Send" else "recv"
    return (
        f"{PREFIX}ring_alg.cc:401] Dispatch{way} rank={rank} {word} key "
        f"1:100:0:0:0:1:1 chunk ({begin}, {end}) sc_idx 1"
    )


ORDER = [
    f"{PREFIX}ring_alg.cc:254] Subdiv 0 device order:",
    f"{JOB}CPU:0",
    f"{JOB}CPU:1",
    " subdiv_offsets: 0  SubdivRank: 1 ",
]


def test_a_recv_counts_its_tensor_bytes_from_sender_to_receiver():
    lines = [
        _process("w", "ReadVariableOp", "CPU:0"),
        _output("w", [100, 10], ptr=777),
        _process("w/_2", "_Recv", "CPU:1", sender="CPU:0"),
        _output("w/_2", [100, 10], ptr=777),
        _process("g/_4", "_Recv", "CPU:0", sender="CPU:1"),
        _output("g/_4", [10], ptr=999, dtype="DT_HALF"),
        _process("ctrl/_6", "_Recv", "CPU:0", sender="CPU:1"),
    ]
    parsed = parse_step(lines)
    weights, gradient = sorted(parsed["transfers"], key=lambda t: -t.nbytes)
    assert (weights.source, weights.destination, weights.nbytes) == (
        "CPU:0",
        "CPU:1",
        4000,
    )
    assert weights.shared_buffer is True
    assert (gradient.source, gradient.nbytes, gradient.shared_buffer) == (
        "CPU:1",
        20,
        False,
    )
    assert parsed["data_free_recvs"] == 1
    totals = per_device(parsed["transfers"], ["CPU:0", "CPU:1"])
    assert totals == {
        "CPU:0": {"sent": 4000, "received": 20},
        "CPU:1": {"sent": 20, "received": 4000},
    }


def test_ring_chunks_are_counted_per_rank_in_the_logged_device_order():
    lines = ORDER + [
        _ring("Send", 0, 1000, 1600),
        _ring("Recv", 1, 5000, 5600),
        _ring("Send", 1, 5600, 6000),
        _ring("Recv", 0, 1600, 2000),
    ]
    order = ring_device_order(lines)
    assert order == ["CPU:0", "CPU:1"]
    parsed = parse_step(lines, order)
    totals = per_device(parsed["transfers"], order)
    assert totals == {
        "CPU:0": {"sent": 600, "received": 400},
        "CPU:1": {"sent": 400, "received": 600},
    }
    row = summarize(parsed, order, variable_shapes=[[250]])
    assert row["gradient_bytes"] == 1000
    assert row["ring_bound"] == ring_bound(2, 1000) == 1000
    assert row["ratio_to_ring_bound"] == pytest.approx(0.6)
    assert row["ring_sent_bytes"] == row["ring_received_bytes"] == 1000
    # A table with sparse gradients counts its rows, gathered, not its size.
    row = summarize(
        parsed, order, [[250], [10, 4]], sparse_shapes=[[10, 4]], row_bytes=800
    )
    assert row["gradient_bytes"] == 1000 and row["row_bytes"] == 800
    assert row["ring_bound"] == ring_bound(2, 1000, 800) == 1000 + 400


def test_ring_bound_is_two_n_minus_one_over_n():
    assert ring_bound(4, 100) == 150
    assert ring_bound(8, 800) == 1400
    # Rows are all-gathered: each device receives the others' (N-1)/N.
    assert ring_bound(4, 100, 40) == 150 + 30


def test_several_ring_orders_cannot_be_mapped():
    other = [ORDER[0], f"{JOB}CPU:1", f"{JOB}CPU:0", ORDER[-1]]
    with pytest.raises(ValueError, match="several device groups"):
        ring_device_order(ORDER + other)


def test_missing_step_markers_are_an_error():
    with pytest.raises(ValueError, match="no markers of step 2"):
        step_lines(["=====kerastower-traffic begin 1", "x"], 2)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("traffic")
    process = run_bench("bench.traffic", "--quick", "--out", str(out))
    assert process.returncode == 0, process.stderr[-3000:]
    results = json.loads((out / "traffic.json").read_text())
    return {row["setup"]: row for row in results["rows"]}, out


def _tiny_gradient_bytes():
    features, units, layers, classes = MODELS["tiny"]
    sizes = [features, *[units] * layers, classes]
    return 4 * sum(a * b + b for a, b in zip(sizes, sizes[1:]))


@pytest.mark.slow
def test_quick_run_measures_every_device_at_or_above_the_ring_bound(quick_run):
    rows, out = quick_run
    assert set(rows) == {"tower", "mirrored_ring"}
    gradient_bytes = _tiny_gradient_bytes()
    for setup, row in rows.items():
        assert row["towers"] == 2 and row["steps_agree"], setup
        assert row["gradient_bytes"] == gradient_bytes, setup
        # No all-reduce moves less than 2 (N-1)/N of the gradients per device.
        for device in row["devices"]:
            assert device["sent"] >= row["ring_bound"], (setup, device)
            assert device["received"] >= row["ring_bound"], (setup, device)
        sent = sum(d["sent"] for d in row["devices"])
        assert sent == sum(d["received"] for d in row["devices"]), setup
        assert row["ratio_to_ring_bound"] < 1.1, setup
    assert "| 2 | tower |" in (out / "traffic.md").read_text()


@pytest.mark.slow
def test_quick_run_sees_the_towers_gradients_and_the_stock_ring(quick_run):
    rows, _ = quick_run
    gradient_bytes = _tiny_gradient_bytes()
    tower = rows["tower"]
    # The towers' gradients are summed on the first tower's device.
    assert tower["device0_received"] >= (2 - 1) * gradient_bytes
    assert tower["device0_received"] < 1.05 * gradient_bytes
    # Stock MirroredStrategy all-reduces one packed gradient in a ring: each
    # of the 2 devices sends and receives half of it twice.
    ring = rows["mirrored_ring"]
    assert {op["op"] for op in ring["collective_ops"]} == {"CollectiveReduceV2"}
    assert ring["ring_sent_bytes"] == ring["ring_received_bytes"]
    assert ring["ring_sent_bytes"] == 2 * (2 - 1) * gradient_bytes
