"""The figures of docs/benchmarks.md agree with the committed results.

Tables and summaries from ``benchmarks.json`` are written by `bench.page` into
``bench/results/benchmarks.md``, and the trace and traffic tables into
``trace.md`` and ``traffic.md``; the page includes them, and the first tests
keep them current and included. The figures that the prose takes from
``trace.json`` and ``traffic.json`` are checked against those files here.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import figures, page  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PAGE = (ROOT / "docs" / "benchmarks.md").read_text()
TEXT = " ".join(PAGE.split())
INCLUDE = re.compile(r'--8<-- "bench/results/benchmarks\.md:([-\w]+)"')


def _load(name):
    return json.loads((RESULTS / name).read_text())


def _phrase(phrase):
    assert phrase in TEXT, f"docs/benchmarks.md should say: {phrase!r}"


def test_span_rounds_both_ends():
    assert figures.span([1.2619, 1.06, 1.1]) == "1.06 to 1.26"
    assert figures.span([2.37, 1.24], digits=1, joiner="-") == "1.2-2.4"
    assert figures.span([0.999, 1.001]) == "1.00"
    with pytest.raises(ValueError, match="must not be empty"):
        figures.span([])


def test_summary_ranges_leave_xla_out_against_one_device():
    def suite(config, plain, tower, mirrored):
        return {
            "workload": "w",
            "config": config,
            "variants": {"plain": plain, "tower2": tower, "mirrored2": mirrored},
        }

    results = {
        "meta": {
            "settings": {"towers": [2], "workloads": ["w"]},
            "machine": {"cpu_count": 2},
        },
        "timing": {
            "suites": {
                "w/default": suite(
                    "default",
                    {"median_s": 0.002},
                    {"median_s": 0.003},
                    {"median_s": 0.004},
                ),
                "w/jit": suite(
                    "jit", {"median_s": 0.001}, {"median_s": 0.005}, {"error": "XLA"}
                ),
            },
            "ratios": [
                {"suite": "w/default", "name": "tower2/plain", "ratio": 1.5},
                {
                    "suite": "w/default",
                    "name": "tower2/mirrored2",
                    "ratio": 0.75,
                    "epoch_wall_ratio": 0.5,
                },
                {"suite": "w/jit", "name": "tower2/plain", "ratio": 5.0},
                {"suite": "w/jit", "name": "tower2/mirrored2", "error": "mirrored2: X"},
            ],
        },
        "memory": {
            "ratios": [{"workload": "w", "name": "tower2/plain", "ratio": 0.98}]
        },
        "accumulation": {"status": "measured", "ratio": 1.1},
    }
    text = "\n".join(figures.summary(results))
    assert "step takes 0.75 times as long, and a whole epoch 0.50 times" in text
    assert "2 towers add 1.0 ms to a 2.0 ms w step (1.50)" in text
    assert "within 2.0% of one device's" in text
    assert "at 5.00 times one device's step" in text
    assert "Stock `MirroredStrategy` fails with it" in text
    assert "costs about 10% per micro-step" in text


def test_generated_file_is_written_from_the_committed_results():
    expected = page.render(_load("benchmarks.json"))
    assert (RESULTS / "benchmarks.md").read_text() == expected, (
        "bench/results/benchmarks.md is stale: run python -m bench.report --docs"
    )


def test_report_docs_writes_the_file_beside_the_json(tmp_path, capsys):
    from bench import report

    shutil.copy(RESULTS / "benchmarks.json", tmp_path / "benchmarks.json")
    report.main([str(tmp_path), "--docs"])
    assert "benchmarks.md" in capsys.readouterr().out
    written = (tmp_path / "benchmarks.md").read_text()
    assert written == (RESULTS / "benchmarks.md").read_text()


def test_page_includes_every_section_once():
    generated = (RESULTS / "benchmarks.md").read_text()
    sections = re.findall(r"\[start:([-\w]+)\]", generated)
    assert sections == list(page.SECTIONS)
    assert sorted(INCLUDE.findall(PAGE)) == sorted(sections)


def test_page_types_no_generated_table_row_by_hand():
    generated = (RESULTS / "benchmarks.md").read_text().splitlines()
    rows = [line for line in generated if line.startswith("| ") and "---" not in line]
    page_lines = {line.strip() for line in PAGE.splitlines()}
    assert not [row for row in rows if row in page_lines]


@pytest.mark.parametrize("name", ["trace", "traffic", "steady"])
def test_included_tables_are_written_from_their_results(name):
    import importlib

    table = importlib.import_module(f"bench.{name}").markdown_table
    expected = table(_load(f"{name}.json")["rows"])
    assert (RESULTS / f"{name}.md").read_text() == expected
    assert f'--8<-- "bench/results/{name}.md"' in PAGE


def test_workload_batch_sizes_match_the_results():
    for suite in _load("benchmarks.json")["timing"]["suites"].values():
        bullet = TEXT.split(f"- **{suite['workload']}**:")[1].split(" - **")[0]
        assert re.search(rf"batch {suite['batch_size']}\b", bullet), bullet


def test_first_step_figures_match_trace_json():
    trace = _load("trace.json")
    rows = {(row["model"], row["setup"]): row for row in trace["rows"]}
    models = ("resnet50", "densenet121", "transformer")
    first = figures.span([rows[m, "tower4"]["first_step_ratio"] for m in models], 1)
    against_stock = figures.span(
        rows[m, "tower4"]["first_step_s"] / rows[m, "mirrored4"]["first_step_s"]
        for m in models
    )
    steady = figures.span(
        (
            rows[m, "mirrored4"]["steady_step_s"] / rows[m, "tower4"]["steady_step_s"]
            for m in models
        ),
        1,
    )
    _phrase(f"4 towers take {first} times a plain model's first step")
    _phrase(f"The first step is still {first} times the plain model's on 4 towers")
    _phrase(f"on the same devices ({against_stock} times)")
    _phrase(f"then takes {steady} times a `TowerModel`'s")
    machine = trace["meta"]["machine"]
    from bench.trace import LOGICAL_DEVICES

    _phrase(
        f"Measured {_where(machine)}, {trace['meta']['date'].split()[0]}, "
        f"commit `{machine['git_commit'][:7]}`, {LOGICAL_DEVICES} logical CPUs "
        f"on {machine['cpu_count']} cores"
    )


def _where(machine):
    """Where the page says a run was measured: on the machine of
    ``benchmarks.json`` (the page's "Machine and run"), or on the one named."""
    if machine["cpu"] == _load("benchmarks.json")["meta"]["machine"]["cpu"]:
        return "on the machine above"
    return f"on another machine ({machine['cpu']}, {machine['cpu_count']} cores)"


def test_where_names_another_machine():
    above = _load("benchmarks.json")["meta"]["machine"]
    assert _where(above) == "on the machine above"
    other = {"cpu": f"not {above['cpu']}", "cpu_count": 2}
    assert _where(other) == f"on another machine (not {above['cpu']}, 2 cores)"


def test_steady_run_is_dated_as_steady_json():
    meta = _load("steady.json")["meta"]
    _phrase(
        f"Measured {_where(meta['machine'])}, {meta['date'].split()[0]}, commit "
        f"`{meta['machine']['git_commit'][:7]}`:"
    )


SYNC = ("once_sync", "once_sync_no_grappler", "once_sync_towers_no_grappler")


def test_trace_once_figures_match_trace_once_json():
    rows = {
        (row["model"], row["mechanism"]): row
        for row in _load("trace_once.json")["rows"]
    }
    ratio = {m: rows["resnet50", m]["total_ratio"] for m in ("copies", "once")}
    noinline = rows["resnet50", "once_noinline"]["total_ratio"]
    _phrase(
        f"On ResNet50, 4 copies traced into the step take {ratio['copies']:.2f} "
        "times the plain step's first step; the tower traced once and called on "
        f"each device takes {ratio['once']:.2f} times when TensorFlow inlines the "
        f"calls (its graph optimisation then sees 4 copies again), and "
        f"{noinline:.2f} times when it does not."
    )
    own = {
        row["loss"]
        for (model, m), row in rows.items()
        if model == "resnet50" and m not in ("plain", *SYNC)
    }
    assert len(own) == 1  # the same step, on each tower's own statistics
    plain = rows["resnet50", "plain"]
    for m in SYNC:  # the whole batch's statistics: one device's step
        assert rows["resnet50", m]["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    sync = {m: rows["resnet50", m]["total_ratio"] for m in SYNC}
    _phrase(
        "the towers take one device's step (the first loss is the plain "
        f"model's), and the first step takes {sync['once_sync']:.2f} times the "
        "plain model's; with TensorFlow's graph optimiser off "
        f"(`once_sync_no_grappler`), {sync['once_sync_no_grappler']:.2f} times, "
        "and with it off for the towers' calls only "
        f"(`once_sync_towers_no_grappler`), "
        f"{sync['once_sync_towers_no_grappler']:.2f} times."
    )


def test_traffic_figures_match_traffic_json():
    traffic = _load("traffic.json")
    meta = traffic["meta"]
    rows = {(row["setup"], row["towers"]): row for row in traffic["rows"]}
    most = max(n for _, n in rows)
    gradient = rows["tower", most]["gradient_bytes"]
    model = meta["model"].split(": ")[1].split(" (")[0]
    _phrase(
        f"The model is an {model} with {gradient / 4e6:.2f} M float32 parameters, "
        f"so its gradients are G = {gradient / 1e6:.1f} MB. The global batch is "
        f"{meta['global_batch_size']} and the optimizer is SGD."
    )
    assert meta["model"].endswith("SGD")
    bandwidth = meta["bandwidth_bytes_per_s"]
    _phrase(f"time at {bandwidth['pcie'] / 1e9:.0f} GB/s")
    _phrase(f"and at {bandwidth['nvlink'] / 1e9:.0f} GB/s")
    _phrase(f"These numbers were measured on {meta['date'].split()[0]}")
    _phrase(f"{rows['tower', most]['ratio_to_ring_bound']:.1f}x at N = {most}")
    _phrase(f"{rows['mirrored_hier', most]['ratio_to_ring_bound']:.2f}x at N = {most}")
    replicas = [row for (setup, _), row in rows.items() if setup == "tower_replicas"]
    counts = figures.listed([str(row["towers"]) for row in replicas])
    ratio = figures.span(row["ratio_to_ring_bound"] for row in replicas)
    over = max(
        max(row["max_sent"], row["max_received"]) - row["ring_bound"]
        for row in replicas
    )
    _phrase(f"moves {ratio}x the ring bound at N = {counts} (the {over / 1e6:.1f} MB")
    shards = max(
        row["send_recv_bytes"] - row["variable_shaped_bytes"]
        for (setup, _), row in rows.items()
        if setup.startswith("tower")
    )
    _phrase(f"at most {shards / 1e6:.2f} MB per step here")


def test_run_times_match_the_results():
    sources = {
        "": "benchmarks.json",
        ".trace": "trace.json",
        ".trace_once": "trace_once.json",
        ".traffic": "traffic.json",
        ".steady": "steady.json",
    }
    stated = re.findall(
        r"^python -m bench(\.\w+)? [^\n]*# [^\n]*about (\d+) minutes? here", PAGE, re.M
    )
    assert sorted(module for module, _ in stated) == sorted(sources)
    for module, minutes in stated:
        measured = _load(sources[module])["meta"]["seconds"] / 60
        assert abs(int(minutes) - measured) <= max(1, 0.1 * measured), (
            f"python -m bench{module}: the page says about {minutes} minutes, "
            f"the results took {measured:.1f}"
        )


def test_the_one_machine_guide_quotes_traffic_json():
    guide = " ".join((ROOT / "docs" / "guides" / "one-machine.md").read_text().split())
    rows = {(row["setup"], row["towers"]): row for row in _load("traffic.json")["rows"]}
    most = max(n for _, n in rows)
    tower, replicas = rows["tower", most], rows["tower_replicas", most]
    ratios = [f"{rows['tower', n]['ratio_to_ring_bound']:.2f}" for n in (2, 4, most)]
    phrases = [
        f"a model with {tower['gradient_bytes'] / 1e6:.1f} MB of gradients",
        f"moves {ratios[0]} times what a ring all-reduce needs on 2 towers, "
        f"{ratios[1]} times on 4 and {ratios[2]} times on {most}",
        f"({tower['max_sent'] / 1e6:.1f} MB sent per step where a ring sends "
        f"{tower['ring_bound'] / 1e6:.1f} MB; about {tower['pcie_ms']:.1f} ms a step "
        f"over PCIe against {replicas['pcie_ms']:.1f} ms",
        "moves "
        + figures.span(
            rows["tower_replicas", n]["ratio_to_ring_bound"] for n in (2, 4, most)
        )
        + " times the ring bound at 2, 4 and 8 towers",
    ]
    own = figures.span(
        rows["tower_replicas_own_step", n]["ratio_to_ring_bound"] for n in (2, 4, most)
    )
    phrases.append(
        f"moves {own} times the ring bound at 2, 4 and 8 towers (the gradients' "
        f"ring and the weights'), against {ratios[0]}, {ratios[1]} and "
        f"{ratios[2]} times without replicas"
    )
    embedding = {
        (row["setup"], row["towers"]): row
        for row in _load("traffic_embedding.json")["rows"]
    }
    phrases.append(
        "and "
        + figures.span(
            embedding["tower_replicas", n]["ratio_to_ring_bound"] for n in (2, 4, 8)
        )
        + " times the bound (the dense ring plus the all-gathered rows) for an "
        "embedding model at 2, 4 and 8"
    )
    for phrase in phrases:
        assert phrase in guide, f"docs/guides/one-machine.md should say: {phrase!r}"
