"""``python -m bench.gpu``: its scaling math, and a ``--tiny`` run on CPUs."""

import json
import sys
from pathlib import Path

import pytest
import tensorflow as tf
from bench_runner import run_bench

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu import add_scaling, device_counts, markdown_table  # noqa: E402


def _run(*args, timeout=300):
    return run_bench("bench.gpu", *args, timeout=timeout)


def test_device_counts_double_up_to_every_device():
    assert device_counts(1) == [1]
    assert device_counts(2) == [1, 2]
    assert device_counts(6) == [1, 2, 4, 6]
    assert device_counts(8) == [1, 2, 4, 8]


def test_scaling_is_against_plain_at_the_same_precision():
    def row(setup, devices, precision, **measured):
        return dict(setup=setup, devices=devices, precision=precision, **measured)

    rows = add_scaling(
        [
            row("plain", 1, "float32", images_per_s=100.0),
            row("plain", 1, "mixed", images_per_s=250.0),
            row("tower", 4, "float32", images_per_s=360.0),
            row("tower", 4, "mixed", images_per_s=800.0),
            row("mirrored", 4, "mixed", error="OOM"),
        ]
    )
    assert rows[2]["speedup"] == pytest.approx(3.6)
    assert rows[2]["scaling_efficiency"] == pytest.approx(0.9)
    assert rows[3]["scaling_efficiency"] == pytest.approx(0.8)
    assert "speedup" not in rows[4]
    for row in rows[4:]:
        row["global_batch"] = 256
    assert "| mirrored | 4 | mixed | 256 | failed: OOM |" in markdown_table(rows[4:])


@pytest.mark.skipif(
    bool(tf.config.list_physical_devices("GPU")), reason="a GPU is visible"
)
def test_without_a_gpu_the_full_benchmark_points_to_tiny(tmp_path):
    process = _run("--out", str(tmp_path), "--steps", "1")
    assert process.returncode == 2
    assert "No GPU is visible" in process.stderr
    assert "--tiny" in process.stderr


@pytest.mark.slow
def test_tiny_run_measures_plain_towers_and_stock_in_both_precisions(tmp_path):
    process = _run("--tiny", "--devices", "2", "--out", str(tmp_path))
    assert process.returncode == 0, process.stderr[-3000:]
    results = json.loads((tmp_path / "gpu.tiny.json").read_text())
    rows = {(r["setup"], r["devices"], r["precision"]): r for r in results["rows"]}
    assert set(rows) == {
        (setup, devices, precision)
        for setup, devices in [("plain", 1), ("tower", 2), ("mirrored", 2)]
        for precision in ("float32", "mixed")
    }
    assert results["meta"]["config"]["tiny"] is True
    for key, row in rows.items():
        assert "error" not in row, (key, row.get("error"))
        assert row["global_batch"] == 8 * row["devices"], key
        assert row["images_per_s"] > 0, key
        assert row["images_per_s"] * row["step_ms"] == pytest.approx(
            1e3 * row["global_batch"]
        )
        plain = rows[("plain", 1, row["precision"])]["images_per_s"]
        assert row["speedup"] == pytest.approx(row["images_per_s"] / plain), key
        assert row["scaling_efficiency"] == pytest.approx(
            row["speedup"] / row["devices"]
        )
    assert rows[("tower", 2, "mixed")]["policy"] == "mixed_bfloat16"
    assert rows[("tower", 2, "float32")]["device_names"] == [
        "/device:CPU:0",
        "/device:CPU:1",
    ]
    table = (tmp_path / "gpu.tiny.md").read_text()
    assert table.count("\n") == 2 + len(rows)
