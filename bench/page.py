"""``benchmarks.md``: every figure of the docs' Benchmarks page, from a run.

`render` turns a results dict (``benchmarks.json``) into one markdown file cut
into named sections (the summary bullets, the machine, the step-time, ratio
and memory tables, the trace count and the accumulation result), each between
pymdownx.snippets section markers. ``docs/benchmarks.md`` includes them by
name and keeps only the explanations around them::

    --8<-- "bench/results/benchmarks.md:step-time"

``python -m bench`` writes the file after a full run;
``python -m bench.report --docs [JSON]`` writes it again from a results file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from bench import figures
from bench.figures import Results, ratio_rows, towers

# CPU flags (`report.machine_info`'s ``cpu_features``) that the machine table names.
CPU_FEATURES = {"avx2": "AVX2", "avx512f": "AVX-512", "amx_tile": "AMX"}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def machine(results: Results) -> list[str]:
    """The table of the machine, the software and the run."""
    meta = results["meta"]
    info = meta["machine"]
    features = [
        label
        for flag, label in CPU_FEATURES.items()
        if flag in info.get("cpu_features", [])
    ]
    cpu = [info["cpu"] + (f" ({', '.join(features)})" if features else "")]
    cpu += [f"{info['cpu_count']} cores", f"{info['memory_gib']} GiB RAM"]
    system = re.match(r"([A-Za-z]+)-(\d+\.\d+)", info["platform"])
    if system:
        cpu.append(" ".join(system.groups()))
    software = (
        f"Python {info['python']}, TensorFlow {info['tensorflow']}, "
        f"Keras {info['keras']}, NumPy {info['numpy']}, "
        f"kerastower {info['kerastower']}"
    )
    if info.get("git_commit"):
        changed = len(info.get("git_dirty_files", []))
        tree = f"{changed} changed files" if changed else "clean tree"
        software += f" at commit `{info['git_commit'][:7]}` ({tree})"
    devices = len(info["logical_cpus"])
    settings = meta["settings"]
    run = (
        f"`{meta['command']}`, {meta['seconds']:.0f} s on {meta['date'].split()[0]}; "
        f"{settings['repeats']} repeats per variant, {settings['steps']} steps per "
        f"timed epoch; load average {meta['load_average_before'][0]:.2f} at the "
        f"start and {meta['load_average_after'][0]:.2f} at the end"
    )
    return _table(
        ["", ""],
        [
            ["CPU", ", ".join(cpu)],
            ["Software", software],
            [
                "Devices",
                f"{devices} logical CPUs ([`kerastower.configure_logical_devices"
                f"({devices})`][kerastower.configure_logical_devices]), all on "
                f"the same {info['cpu_count']} cores",
            ],
            ["Run", run],
        ],
    )


def step_time(results: Results) -> list[str]:
    """Milliseconds per step of every suite (rows) and variant (columns)."""
    variants = ["plain"]
    variants += [
        f"{kind}{n}" for kind in ("tower", "mirrored") for n in towers(results)
    ]
    rows = []
    for key, suite in results["timing"]["suites"].items():
        cells = []
        for name in variants:
            result = suite["variants"].get(name, {})
            if "median_s" in result:
                cells.append(f"{1e3 * result['median_s']:.2f}")
            else:
                cells.append("fails" if "error" in result else "")
        rows.append([key.replace("/", ", "), *cells])
    header = ["one device" if name == "plain" else f"`{name}`" for name in variants]
    return _table(["Setting", *header], rows)


def _ratio_table(
    results: Results,
    title: str,
    denominators: list[str],
    field: str,
    keep: Callable[[str], bool],
) -> list[str]:
    """Rows ``towerN / <denominator>``, one column per suite that `keep` keeps."""
    suites = [key for key in results["timing"]["suites"] if keep(key)]
    rows = []
    for denominator in denominators:
        found = ratio_rows(results, denominator)
        for n in towers(results):
            cells = []
            for key in suites:
                row = found.get((key, n), {})
                if field in row:
                    cells.append(f"{row[field]:.2f}")
                elif "error" in row:
                    stock = row["error"].startswith("mirrored")
                    cells.append("stock fails" if stock else "fails")
                else:
                    cells.append("")
            if any(cells):
                other = denominator.replace("N", str(n)).replace("plain", "one device")
                rows.append([f"tower{n} / {other}", *cells])
    return _table([title, *suites], rows)


def step_ratios(results: Results) -> list[str]:
    """Step-time ratios of towers against one device and stock Keras, per suite."""
    return _ratio_table(
        results,
        "Ratio (step time)",
        ["plain", "mirroredN", "mirrored_collN"],
        "ratio",
        lambda key: True,
    )


def epoch_ratios(results: Results) -> list[str]:
    """Whole-epoch ratios, in the suites in which stock Keras ran."""
    ran = {
        suite
        for (suite, _), row in ratio_rows(results, "mirroredN").items()
        if "epoch_wall_ratio" in row
    }
    return _ratio_table(
        results,
        "Ratio (whole epoch)",
        ["mirroredN", "plain"],
        "epoch_wall_ratio",
        ran.__contains__,
    )


def memory(results: Results) -> list[str]:
    """The floor, the peak-memory ratios and what towers and stock Keras add."""
    lines = [
        f"Peak resident memory (`VmHWM`), one process per variant, "
        f"{results['memory']['epochs']} epochs, as a ratio."
    ]
    floors = [
        value["peak_rss_mib"]
        for key, value in results["memory"]["peak_rss"].items()
        if key.endswith("/floor") and "peak_rss_mib" in value
    ]
    if floors:
        lines[0] += (
            " The `floor` process only starts TensorFlow "
            f'({figures.span(floors, 0)} MiB); "above the floor" compares what '
            "each variant adds to it."
        )
    lines.append("")
    names = [f"tower{n}/mirrored{n}" for n in towers(results)]
    names += [f"tower{n}/plain" for n in towers(results)]
    ratios = {
        (row["workload"], row["name"]): row for row in results["memory"]["ratios"]
    }
    workloads = dict.fromkeys(
        key.split("/")[0] for key in results["memory"]["peak_rss"]
    )
    rows = []
    for workload in workloads:
        for label, field in (
            ("whole peak", "ratio"),
            ("above the floor", "ratio_above_floor"),
        ):
            cells = [ratios.get((workload, name), {}).get(field) for name in names]
            if any(cell is not None for cell in cells):
                texts = ["" if cell is None else f"{cell:.2f}" for cell in cells]
                rows.append([f"{workload}, {label}", *texts])
    header = [name.replace("/", " / ").replace("plain", "one device") for name in names]
    lines += _table(["Workload", *header], rows)
    sentence = figures.memory_sentence(results)
    return lines + ([""] + sentence if sentence else [])


SECTIONS: dict[str, Callable[[Results], list[str]]] = {
    "summary": figures.summary,
    "machine": machine,
    "step-time": step_time,
    "step-ratios": step_ratios,
    "traces": figures.traces,
    "epoch-ratios": epoch_ratios,
    "memory": memory,
    "accumulation": figures.accumulation,
}


def render(results: Results) -> str:
    """Every section of ``benchmarks.md``, between snippets section markers."""
    lines = [
        "<!-- Written by `python -m bench.report --docs` (bench/page.py) from "
        "benchmarks.json: do not edit. docs/benchmarks.md includes its sections. -->"
    ]
    for name, build in SECTIONS.items():
        lines += [
            "",
            f"<!-- --8<-- [start:{name}] -->",
            *build(results),
            f"<!-- --8<-- [end:{name}] -->",
        ]
    return "\n".join(lines) + "\n"


def write(results: Results, path: Path) -> None:
    """Writes `render` of `results` to `path`."""
    path.write_text(render(results))
