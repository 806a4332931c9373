"""Smoke run of the benchmarks (``python -m bench --quick``) and its ratio math."""

import json
import statistics
import sys
from pathlib import Path

import pytest
from bench_runner import run_bench

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.report import memory_ratios, timing_ratios  # noqa: E402
from bench.timing import paired_ratio  # noqa: E402
from bench.trace import markdown_table, medians, with_ratios  # noqa: E402


def _suite(**repeats):
    return {
        "variants": {
            name: {"repeats_s": times, "median_s": statistics.median(times)}
            for name, times in repeats.items()
        }
    }


def test_paired_ratio_is_the_median_of_per_repeat_ratios():
    suite = _suite(tower2=[2.0, 4.0, 6.0], plain=[1.0, 2.0, 2.0])
    ratio = paired_ratio(suite, "tower2", "plain")
    assert ratio["per_repeat"] == [2.0, 2.0, 3.0]
    assert ratio["ratio"] == 2.0
    assert ratio["ratio_of_medians"] == 2.0


def test_ratio_against_a_failed_variant_carries_its_error():
    suite = _suite(tower2=[1.0], plain=[1.0])
    suite["variants"]["mirrored2"] = {"error": "InvalidArgumentError: XLA"}
    rows = timing_ratios({"mlp/jit": suite}, towers=[2])
    by_name = {row["name"]: row for row in rows}
    assert by_name["tower2/mirrored2"]["error"].startswith("mirrored2: Invalid")
    assert "pass" not in by_name["tower2/mirrored2"]
    assert by_name["tower2/plain"]["pass"] is True


def test_targets_are_checked_against_their_limits():
    suite = _suite(
        plain=[1.0, 1.0],
        tower1=[1.06, 1.06],
        tower2=[1.09, 1.09],
        mirrored2=[1.7, 1.75],
    )
    rows = {row["name"]: row for row in timing_ratios({"s/default": suite}, [2])}
    assert rows["tower1/plain"]["target"] == 1.05
    assert rows["tower1/plain"]["pass"] is False
    assert rows["tower2/plain"]["pass"] is True
    expected = (1.09 / 1.7 + 1.09 / 1.75) / 2
    assert rows["tower2/mirrored2"]["ratio"] == pytest.approx(expected)
    assert rows["tower2/mirrored2"]["pass"] is False
    assert "pass" not in rows["mirrored2/plain"]


def test_memory_ratios_whole_and_above_floor():
    peaks = {
        "m/floor": {"peak_rss_mib": 600.0},
        "m/plain": {"peak_rss_mib": 640.0},
        "m/tower2": {"peak_rss_mib": 650.0},
        "m/mirrored2": {"peak_rss_mib": 700.0},
    }
    rows = {row["name"]: row for row in memory_ratios(peaks)}
    assert rows["tower2/mirrored2"]["ratio"] == pytest.approx(650 / 700)
    assert rows["tower2/mirrored2"]["ratio_above_floor"] == pytest.approx(0.5)
    assert rows["tower2/plain"]["ratio_above_floor"] == pytest.approx(50 / 40)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    process = run_bench("bench", "--quick", "--out", str(out))
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads((out / "benchmarks.json").read_text()), out


@pytest.mark.slow
def test_quick_run_writes_every_section(quick_run):
    results, out = quick_run
    assert set(results) >= {
        "meta",
        "targets",
        "timing",
        "traces",
        "memory",
        "accumulation",
    }
    assert (out / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["meta"]["quick"] is True
    assert results["meta"]["machine"]["tensorflow"]
    suites = results["timing"]["suites"]
    assert {key.split("/")[1] for key in suites} == {"default", "jit", "spe4"}
    default = suites["tiny_mlp/default"]["variants"]
    assert set(default) == {"plain", "tower1", "tower2", "mirrored2"}
    for suite in suites.values():
        for result in suite["variants"].values():
            assert len(result["repeats_s"]) == 2
            assert all(0 < t < 1 for t in result["repeats_s"])
            assert result["median_s"] == statistics.median(result["repeats_s"])


@pytest.mark.slow
def test_quick_run_ratios_match_its_raw_timings(quick_run):
    results, _ = quick_run
    suites = results["timing"]["suites"]
    names = {(r["suite"], r["name"]) for r in results["timing"]["ratios"]}
    assert ("tiny_mlp/default", "tower2/mirrored2") in names
    assert ("tiny_mlp/default", "tower1/plain") in names
    for row in results["timing"]["ratios"]:
        numerator, denominator = row["name"].split("/")
        variants = suites[row["suite"]]["variants"]
        expected = statistics.median(
            a / b
            for a, b in zip(
                variants[numerator]["repeats_s"], variants[denominator]["repeats_s"]
            )
        )
        assert row["ratio"] == pytest.approx(expected)
        if row["target"] is not None:
            assert row["pass"] == (row["ratio"] <= row["target"])


@pytest.mark.slow
def test_quick_run_counts_traces_and_memory(quick_run):
    results, _ = quick_run
    for name, traces in results["traces"]["variants"].items():
        # 23 examples in batches of 8: sizes 8, 8, 7 per epoch, 3 epochs.
        assert traces["batches"] == 9, name
        assert traces["distinct_batch_shapes"] == 2, name
        assert traces["traces"] == len(traces["traced_at"]) >= 1, name
    assert results["traces"]["variants"]["tower2"]["pass"] is True
    peaks = results["memory"]["peak_rss"]
    assert set(peaks) == {"tiny_mlp/tower2", "tiny_mlp/mirrored2"}
    assert all(100 < p["peak_rss_mib"] < 10_000 for p in peaks.values())
    (ratio,) = results["memory"]["ratios"]
    assert ratio["ratio"] == pytest.approx(
        peaks["tiny_mlp/tower2"]["peak_rss_mib"]
        / peaks["tiny_mlp/mirrored2"]["peak_rss_mib"]
    )
    accumulation = results["accumulation"]
    if accumulation["status"] == "measured":
        assert accumulation["ratio"] > 0
        assert accumulation["accumulation_steps"] == 2
    else:
        assert accumulation == {"status": "not available"}


def test_bare_tensorflow_times_the_same_split_beside_towers(capsys):
    from bench.profile import bare_tensorflow
    from bench.workloads import WORKLOADS

    times = bare_tensorflow(WORKLOADS["tiny_mlp"], towers=2, repeats=1)
    assert set(times) == {"plain", "tower2", "bare1", "bare2"}
    assert all(t.shape == (1,) and t[0] > 0 for t in times.values())
    assert "tower2/plain" in capsys.readouterr().out


def test_bare_tensorflow_loops_over_steps_per_execution(capsys):
    from bench.profile import bare_tensorflow
    from bench.workloads import WORKLOADS

    times = bare_tensorflow(
        WORKLOADS["tiny_mlp"], towers=2, repeats=1, steps_per_execution=4
    )
    assert set(times) == {"plain", "tower2", "bare1", "bare2"}
    assert all(t.shape == (1,) and t[0] > 0 for t in times.values())
    assert "steps_per_execution=4" in capsys.readouterr().out


def test_trace_ratios_are_over_the_plain_model_of_the_same_run():
    rows = with_ratios(
        [
            {"model": "m", "setup": "plain", "first_step_s": 2.0, "steady_step_s": 0.1},
            {
                "model": "m",
                "setup": "tower4",
                "first_step_s": 5.0,
                "steady_step_s": 0.12,
            },
            {"model": "m", "setup": "mirrored4", "error": "boom"},
            {
                "model": "n",
                "setup": "tower2",
                "first_step_s": 1.0,
                "steady_step_s": 0.1,
            },
        ]
    )
    assert rows[1]["first_step_ratio"] == 2.5
    assert rows[1]["steady_step_ratio"] == pytest.approx(1.2)
    assert "first_step_ratio" not in rows[3]  # no plain row for model n
    table = markdown_table(rows)
    assert "| m | tower4 | 5.0 | 2.50 | 120 | 1.20 |" in table
    assert "| m | mirrored4 | error: boom" in table


def test_trace_rows_hold_the_medians_of_their_runs_and_the_first_error():
    runs = [
        {
            "model": "m",
            "setup": "tower4",
            "build_s": b,
            "first_step_s": t,
            "first_fit_s": t + 1,
            "steady_step_s": s,
        }
        for b, t, s in ((0.7, 5.0, 0.3), (0.5, 9.0, 0.1), (0.6, 4.0, 0.2))
    ]
    row = medians(runs)
    assert row["build_s"] == 0.6
    assert (row["first_step_s"], row["first_fit_s"], row["steady_step_s"]) == (
        5.0,
        6.0,
        0.2,
    )
    assert row["first_step_runs"] == [5.0, 9.0, 4.0]
    table = markdown_table(with_ratios([row]))
    assert "| m | tower4 | 5.0 (4.0-9.0) |  | 200 |  |" in table
    failed = {"model": "m", "setup": "tower4", "error": "boom"}
    assert medians([runs[0], failed]) == failed


@pytest.mark.slow
def test_trace_times_the_chief_of_two_local_workers():
    from bench import trace

    row = trace.measure("convbn", "workers4")
    assert "error" not in row, row
    # The chief times its own fit: 2 towers on its half of the global batch.
    assert row["first_step_s"] > row["steady_step_s"] > 0, row


def test_steady_table_shows_each_path_against_its_copies():
    from bench.steady import markdown_table as steady_table

    rows = [
        {
            "model": "m",
            "path": "tower4",
            "traced_step_s": 0.12,
            "copies_step_s": 0.1,
            "ratio": 1.2,
            "ratios": [1.1, 1.2, 1.4],
        },
        {"model": "m", "path": "replicas4", "error": "boom"},
    ]
    table = steady_table(rows)
    assert "| m | tower4 | 120 | 100 | 1.20 (1.10-1.40) |" in table
    assert "| m | replicas4 | error: boom" in table


@pytest.mark.slow
def test_steady_times_both_designs_side_by_side():
    from bench import steady

    row = steady.measure("convbn", "tower4", repeats=2)
    assert "error" not in row, row
    assert len(row["ratios"]) == 2
    assert row["traced_step_s"] > 0 and row["copies_step_s"] > 0
    assert row["ratio"] == pytest.approx(statistics.median(row["ratios"]))


@pytest.mark.slow
def test_gather_quick_run_times_the_three_variants(tmp_path):
    process = run_bench("bench.gather", "--quick", "--out", str(tmp_path))
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads((tmp_path / "gather.json").read_text())
    assert set(result["ms_per_step"]) == {"plain", "shards", "gathered"}
    for name, times in result["raw_ms"].items():
        assert len(times) == 2 and all(t > 0 for t in times), name
    gathered, shards = result["raw_ms"]["gathered"], result["raw_ms"]["shards"]
    expected = statistics.median(g / s for g, s in zip(gathered, shards))
    assert result["ratios"]["gathered/shards"] == round(expected, 3)
    assert "| gathered / shards |" in (tmp_path / "gather.md").read_text()


@pytest.mark.slow
def test_trace_once_mechanisms_take_the_same_step(tmp_path):
    from bench import trace_once

    results = trace_once.run(["convbn"], towers=2, out=tmp_path, log=lambda _: None)
    rows = {row["mechanism"]: row for row in results["rows"]}
    assert set(rows) == set(trace_once.MECHANISMS)
    # Traced once or per tower, the towers take the same step.
    for mechanism in ("once", "once_noinline"):
        assert rows[mechanism]["loss"] == pytest.approx(rows["copies"]["loss"], 1e-6)
        # The step's own graph calls the tower function instead of holding it.
        assert rows[mechanism]["step_ops"] < rows["copies"]["step_ops"] / 2
    # Statistics summed by collectives in the function traced once: the
    # towers take the step of one device (float32 sums in another order).
    for mechanism in [m for m in trace_once.MECHANISMS if m.startswith("once_sync")]:
        sync = rows[mechanism]
        assert sync["loss"] == pytest.approx(rows["plain"]["loss"], 1e-6)
        assert sync["loss"] != pytest.approx(rows["copies"]["loss"], 1e-4)
        assert sync["step_ops"] < rows["copies"]["step_ops"] / 2
    assert rows["plain"]["total_ratio"] == 1.0
    assert "| convbn | once_noinline | 2 |" in (tmp_path / "trace_once.md").read_text()


@pytest.mark.slow
def test_loss_check_quick_run_times_both_variants(tmp_path):
    process = run_bench("bench.loss_check", "--quick", "--out", str(tmp_path))
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads((tmp_path / "loss_check.json").read_text())
    assert set(result["ms_per_step"]) == {"checked", "unchecked"}
    for name, times in result["raw_ms"].items():
        assert len(times) == 2 and all(t > 0 for t in times), name
    checked, unchecked = result["raw_ms"]["checked"], result["raw_ms"]["unchecked"]
    expected = statistics.median(c / u for c, u in zip(checked, unchecked))
    assert result["ratios"]["steady"] == round(expected, 3)
    assert "| steady step |" in (tmp_path / "loss_check.md").read_text()
