"""Ratios, targets, machine facts, the JSON file and the plot."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.timing import paired_ratio

TARGETS = {
    "tower1/plain": 1.05,
    "towerN/plain": 1.10,
    "towerN/mirroredN": 0.60,
}


def timing_ratios(suites: dict[str, dict[str, Any]], towers: Iterable[int]) -> list:
    """Every target ratio that a suite can give, with its verdict.

    Args:
        suites: ``{"<workload>/<config>": run_suite result}``.
        towers: The tower counts ``N`` measured.

    Returns:
        A list of dicts: suite, ratio name, numerator and denominator variants,
        the ratio (median over repeats of the per-repeat ratio), the target
        and ``pass`` (``ratio <= target``); ratios against a variant that
        failed carry its ``error`` instead.
    """
    rows = []
    for key, suite in suites.items():
        pairs = [("tower1/plain", "tower1", "plain")]
        for n in towers:
            pairs += [
                ("towerN/plain", f"tower{n}", "plain"),
                ("towerN/mirroredN", f"tower{n}", f"mirrored{n}"),
                (None, f"tower{n}", f"mirrored_coll{n}"),
                (None, f"mirrored{n}", "plain"),
            ]
        for target_name, numerator, denominator in pairs:
            if not {numerator, denominator} <= set(suite["variants"]):
                continue
            ratio = paired_ratio(suite, numerator, denominator)
            target = TARGETS.get(target_name)
            row = {
                "suite": key,
                "name": f"{numerator}/{denominator}",
                "target_name": target_name,
                "target": target,
                **ratio,
            }
            if target is not None and "ratio" in ratio:
                row["pass"] = ratio["ratio"] <= target
            rows.append(row)
    return rows


def memory_ratios(memory: dict[str, dict[str, Any]]) -> list:
    """Peak-RSS ratios of towers against stock Keras and a plain model.

    Each ratio is given on the whole peak and on the peak above the ``floor``
    process (TensorFlow started, no model), which is what the model, its
    training state and the strategy cost.
    """
    rows = []
    workloads = sorted({key.split("/")[0] for key in memory})
    for workload in workloads:
        peaks = {
            key.split("/")[1]: value["peak_rss_mib"]
            for key, value in memory.items()
            if key.startswith(f"{workload}/") and "peak_rss_mib" in value
        }
        floor = peaks.get("floor")
        for name in sorted(peaks):
            if not name.startswith("tower"):
                continue
            n = name.removeprefix("tower")
            for other in (f"mirrored{n}", "plain"):
                if other not in peaks:
                    continue
                row = {
                    "workload": workload,
                    "name": f"{name}/{other}",
                    "ratio": peaks[name] / peaks[other],
                }
                if floor is not None and peaks[other] > floor:
                    row["ratio_above_floor"] = (peaks[name] - floor) / (
                        peaks[other] - floor
                    )
                rows.append(row)
    return rows


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine_info() -> dict[str, Any]:
    """CPU, memory, load, versions and the git commit of this run."""
    import keras
    import numpy as np
    import tensorflow as tf

    import kerastower

    cpu, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    return {
        "cpu": cpu,
        "cpu_features": sorted(flags & {"avx2", "avx512f", "amx_tile"}),
        "cpu_count": os.cpu_count(),
        "memory_gib": memory_gib,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "kerastower": kerastower.__version__,
        "logical_cpus": [d.name for d in tf.config.list_logical_devices("CPU")],
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "git_commit": _run(["git", "rev-parse", "HEAD"]),
        "git_dirty_files": _run(
            ["git", "status", "--porcelain", "--untracked-files=no"]
        ).splitlines(),
    }


def write_json(results: dict[str, Any], path: Path) -> None:
    """Writes `results` as indented JSON."""
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")


def plot(results: dict[str, Any], path: Path) -> None:
    """Draws step times, ratios against targets and peak memory into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = results["timing"]["suites"]
    workloads = list(dict.fromkeys(key.split("/")[0] for key in suites))
    configs = list(dict.fromkeys(key.split("/")[1] for key in suites))
    fig, axes = plt.subplots(
        2, max(2, len(workloads)), figsize=(6 * max(2, len(workloads)), 9.5)
    )
    for ax, workload in zip(axes[0], workloads):
        names = list(
            dict.fromkeys(
                name
                for config in configs
                for name in suites.get(f"{workload}/{config}", {}).get("variants", {})
            )
        )
        width = 0.8 / len(configs)
        for c, config in enumerate(configs):
            variants = suites.get(f"{workload}/{config}", {}).get("variants", {})
            xs, heights, lows, highs = [], [], [], []
            for i, name in enumerate(names):
                result = variants.get(name, {})
                if "median_s" not in result:
                    continue
                median = 1e3 * result["median_s"]
                xs.append(i + (c - (len(configs) - 1) / 2) * width)
                heights.append(median)
                lows.append(median - 1e3 * min(result["repeats_s"]))
                highs.append(1e3 * max(result["repeats_s"]) - median)
            ax.bar(xs, heights, width, yerr=[lows, highs], capsize=2, label=config)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_ylabel("ms per step (median; bars: min-max of repeats)")
        ax.set_title(suites[f"{workload}/{configs[0]}"]["description"], fontsize=8)
        ax.legend(fontsize=8)

    ax = axes[1][0]
    rows = [r for r in results["timing"]["ratios"] if r.get("target") and "ratio" in r]
    labels = [f"{r['suite']}  {r['name']}" for r in rows]
    colors = ["tab:green" if r["pass"] else "tab:red" for r in rows]
    ys = range(len(rows))
    ax.barh(ys, [r["ratio"] for r in rows], color=colors)
    ax.scatter([r["target"] for r in rows], ys, marker="|", s=200, color="black")
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("step-time ratio (green: meets target |, red: misses it)")

    ax = axes[1][1]
    peaks = {
        key: value["peak_rss_mib"]
        for key, value in results["memory"]["peak_rss"].items()
        if "peak_rss_mib" in value
    }
    floors = {
        key.split("/")[0]: peak for key, peak in peaks.items() if key.endswith("/floor")
    }
    bars = {
        key: peak - floors.get(key.split("/")[0], 0.0)
        for key, peak in peaks.items()
        if not key.endswith("/floor")
    }
    ax.barh(range(len(bars)), list(bars.values()))
    ax.set_yticks(range(len(bars)), list(bars), fontsize=8)
    ax.invert_yaxis()
    floor_text = ", ".join(f"{w} {v:.0f}" for w, v in floors.items())
    ax.set_xlabel(
        f"MiB of peak RSS above the floor ({floor_text} MiB)"
        if floors
        else "peak RSS, MiB (one process per variant)"
    )
    for extra in [*axes[0][len(workloads) :], *axes[1][2:]]:
        extra.axis("off")
    meta = results["meta"]
    fig.suptitle(
        f"kerastower benchmarks - {meta['machine']['cpu_count']} cores, "
        f"TF {meta['machine']['tensorflow']}, Keras {meta['machine']['keras']}"
        f"{' (quick smoke run)' if meta['quick'] else ''}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict[str, Any]) -> str:
    """Every table of a results dict, targets and verdicts included, as markdown.

    `bench.page` writes the figures that the docs' Benchmarks page shows.
    """
    suites = results["timing"]["suites"]
    lines = [
        "| Suite | Ratio | Value | Target | Verdict | Whole-epoch ratio |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["timing"]["ratios"]:
        if "ratio" in row:
            value = f"{row['ratio']:.2f}"
            wall = f"{row.get('epoch_wall_ratio', float('nan')):.2f}"
        else:
            value, wall = "failed (see below)", ""
        target = f"<= {row['target']:.2f}" if row["target"] else ""
        verdict = {True: "pass", False: "**miss**", None: ""}[row.get("pass")]
        lines.append(
            f"| {row['suite']} | {row['name']} | {value} | {target} | {verdict} "
            f"| {wall} |"
        )
    lines += ["", "| Suite | Variant | ms per step (median) | min - max |"]
    lines += ["|---|---|---|---|"]
    for key, suite in suites.items():
        for name, result in suite["variants"].items():
            if "median_s" in result:
                low, high = min(result["repeats_s"]), max(result["repeats_s"])
                lines.append(
                    f"| {key} | {name} | {1e3 * result['median_s']:.2f} "
                    f"| {1e3 * low:.2f} - {1e3 * high:.2f} |"
                )
            else:
                error = result["error"].split(" (defined @")[0][:90]
                lines.append(f"| {key} | {name} | failed: {error} | |")
    lines += ["", "| Variant | Traces | Traced at [epoch, batch] | Verdict |"]
    lines += ["|---|---|---|---|"]
    for name, value in results["traces"]["variants"].items():
        if "traces" in value:
            verdict = "pass" if value["pass"] else "**miss**"
            lines.append(
                f"| {name} | {value['traces']} | {value['traced_at']} | {verdict} |"
            )
        else:
            lines.append(f"| {name} | {value['error']} | | |")
    lines += ["", "| Workload | Variant | Peak RSS (MiB) |", "|---|---|---|"]
    for key, value in results["memory"]["peak_rss"].items():
        workload, name = key.split("/")
        peak = f"{value['peak_rss_mib']:.0f}" if "peak_rss_mib" in value else "failed"
        lines.append(f"| {workload} | {name} | {peak} |")
    lines += ["", "| Workload | Ratio | Whole peak | Above the floor |"]
    lines += ["|---|---|---|---|"]
    for row in results["memory"]["ratios"]:
        above = row.get("ratio_above_floor")
        above_text = f"{above:.2f}" if above is not None else ""
        lines.append(
            f"| {row['workload']} | {row['name']} | {row['ratio']:.3f} | {above_text} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.report [JSON] [--docs]``: tables of a results file."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m bench.report",
        description="Every table of a benchmarks.json as markdown.",
    )
    parser.add_argument(
        "source",
        nargs="?",
        type=Path,
        default=Path(__file__).parent / "results" / "benchmarks.json",
        help="benchmarks.json, or a folder that holds it (default: bench/results/)",
    )
    parser.add_argument(
        "--docs",
        action="store_true",
        help="write benchmarks.md beside the JSON: the figures that "
        "docs/benchmarks.md includes",
    )
    args = parser.parse_args(argv)
    source = args.source / "benchmarks.json" if args.source.is_dir() else args.source
    results = json.loads(source.read_text())
    if args.docs:
        from bench import page

        target = source.with_suffix(".md")
        page.write(results, target)
        print(f"wrote {target}")
    else:
        print(markdown(results))


if __name__ == "__main__":
    main()
