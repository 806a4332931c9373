"""``python -m bench``: every benchmark in one process run.

Writes ``benchmarks.json`` (raw timings, medians, ratios, targets with
pass/fail, machine and versions) and ``benchmarks.png`` to ``--out``, and
after a full run ``benchmarks.md``, the figures that ``docs/benchmarks.md``
includes (`bench.page`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEVICES = 4
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure.

    Attributes:
        workloads: Names in `bench.workloads.WORKLOADS` to time.
        towers: Tower (and replica) counts ``N`` compared with stock Keras.
        steps: Global batches per timed epoch.
        repeats: Timed epochs per variant (the median is reported).
        steps_per_execution: The value > 1 that the ``spe`` suites use.
        smoke: Time only what a smoke run needs: no collective baseline, and
            only ``plain`` and ``towerN`` in the jit and ``spe`` suites and
            the trace count.
        trace_workload: Workload of the trace count.
        memory_workloads: Workloads whose peak RSS is measured.
        memory_parallel: Run the memory processes at once (smoke runs).
        accumulation_workload: Workload of the accumulation benchmark.
        accumulation_steps: ``k`` of `GradientAccumulation(k)`.
    """

    workloads: tuple[str, ...] = ("mlp", "convnet")
    towers: tuple[int, ...] = (2, 4)
    steps: int = 48
    repeats: int = 7
    steps_per_execution: int = 8
    smoke: bool = False
    trace_workload: str = "mlp"
    memory_workloads: tuple[str, ...] = ("mlp", "convnet")
    memory_parallel: bool = False
    accumulation_workload: str = "mlp"
    accumulation_steps: int = 4


QUICK = Settings(
    workloads=("tiny_mlp",),
    towers=(2,),
    steps=8,
    repeats=2,
    steps_per_execution=4,
    smoke=True,
    trace_workload="tiny_mlp",
    memory_workloads=("tiny_mlp",),
    memory_parallel=True,
    accumulation_workload="tiny_mlp",
    accumulation_steps=2,
)


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _suites(settings: Settings):
    """``(config name, jit_compile, steps_per_execution, variants)`` per suite."""
    from bench.workloads import Variant

    full = not settings.smoke

    def variants(jit: bool, spe: int, tower1: bool, mirrored: bool, collective: bool):
        out = [Variant("plain", 1, jit, spe)]
        out += [Variant("tower", 1, jit, spe)] if tower1 else []
        out += [Variant("tower", n, jit, spe) for n in settings.towers]
        if mirrored:
            out += [Variant("mirrored", n, jit, spe) for n in settings.towers]
        if collective:
            # The GPU path (replicas, ring all-reduce) against stock's ring.
            out += [Variant("tower_replicas", n, jit, spe) for n in settings.towers]
            out += [
                Variant("mirrored_collective", n, jit, spe) for n in settings.towers
            ]
        return out

    spe = settings.steps_per_execution
    return [
        ("default", variants(False, 1, True, True, full)),
        # Stock Keras with jit_compile=True under MirroredStrategy compiles every
        # replica into one XLA cluster on the first device; it fails on
        # logical CPUs. It is tried so that the results say so.
        ("jit", variants(True, 1, full, full, False)),
        (f"spe{spe}", variants(False, spe, full, full, False)),
    ]


def _memory_probes(settings: Settings) -> list[tuple[str, str, int]]:
    probes = []
    for workload in settings.memory_workloads:
        if not settings.smoke:
            probes += [(workload, "floor", 1), (workload, "plain", 1)]
        for n in settings.towers:
            probes += [(workload, "tower", n), (workload, "mirrored", n)]
    return probes


def run(settings: Settings, out: Path, quick: bool) -> dict[str, Any]:
    """Runs every benchmark and writes the JSON file and the plot to `out`."""
    from bench import memory

    started = time.perf_counter()
    load_before = os.getloadavg()
    probes = _memory_probes(settings)
    handles = (
        memory.start(probes, steps=settings.steps, parallel=True)
        if settings.memory_parallel
        else None
    )

    import kerastower

    kerastower.configure_logical_devices(DEVICES)

    from bench import report
    from bench.accumulation import run_accumulation
    from bench.timing import run_suite
    from bench.traces import run_traces
    from bench.workloads import WORKLOADS, Variant

    suites = {}
    for workload_name in settings.workloads:
        workload = WORKLOADS[workload_name]
        for config, variants in _suites(settings):
            key = f"{workload_name}/{config}"
            _log(f"timing {key}: {workload.description}")
            suites[key] = run_suite(
                workload, variants, settings.steps, settings.repeats, log=_log
            )
            suites[key]["config"] = config

    _log("counting traces")
    trace_variants = [Variant("plain")] + [Variant("tower", n) for n in settings.towers]
    if not settings.smoke:
        trace_variants.insert(1, Variant("tower", 1))
        trace_variants += [Variant("mirrored", n) for n in settings.towers]
    traces = run_traces(WORKLOADS[settings.trace_workload], trace_variants, log=_log)

    _log("gradient accumulation")
    accumulation = run_accumulation(
        WORKLOADS[settings.accumulation_workload],
        towers=settings.towers[0],
        accumulation_steps=settings.accumulation_steps,
        steps=settings.steps,
        repeats=settings.repeats,
        log=_log,
    )

    _log("peak memory, one process per variant")
    if handles is None:
        handles = memory.start(probes, steps=settings.steps)
    peak_rss = memory.collect(handles, log=_log)

    ratios = report.timing_ratios(suites, settings.towers)
    trace_rows = [
        {"name": f"traces {name}", **value}
        for name, value in traces["variants"].items()
        if "pass" in value
    ]
    checked = [r for r in ratios if "pass" in r] + trace_rows
    missed = [r["suite"] + " " + r["name"] for r in ratios if r.get("pass") is False]
    missed += [r["name"] for r in trace_rows if not r["pass"]]
    results = {
        "meta": {
            "command": " ".join(["python -m bench", *sys.argv[1:]]),
            "quick": quick,
            "settings": dataclasses.asdict(settings),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": report.machine_info(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "seconds": None,
            "notes": [
                "Step times are wall-clock seconds per step: median over the "
                "train-function calls of one epoch (first call left out), then "
                "median over repeats; variants run interleaved in each repeat.",
                "Ratios are the median over repeats of the per-repeat ratio.",
                "Stock Keras baseline 'mirroredN' is MirroredStrategy on the "
                "first N logical CPUs with cross_device_ops=ReductionToOneDevice() "
                "(the default collective all-reduce clashes between several "
                "strategies in one process); 'mirrored_collN' uses the default "
                "collective ops with a moved collective key base.",
                "Logical CPUs share the machine's cores: one plain device is the "
                "physical limit.",
            ],
        },
        "targets": {
            "definitions": report.TARGETS | {"traces": "<= distinct batch shapes"},
            "checked": len(checked),
            "missed": missed,
            "all_pass": not missed,
        },
        "timing": {"suites": suites, "ratios": ratios},
        "traces": traces,
        "memory": {
            "peak_rss": peak_rss,
            "ratios": report.memory_ratios(peak_rss),
            "steps_per_epoch": settings.steps,
            "epochs": 2,
        },
        "accumulation": accumulation,
    }
    results["meta"]["seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, out / "benchmarks.json")
    report.plot(results, out / "benchmarks.png")
    _log(f"wrote {out / 'benchmarks.json'} and {out / 'benchmarks.png'}")
    if not quick:
        from bench import page

        page.write(results, out / "benchmarks.md")
        _log(f"wrote {out / 'benchmarks.md'}, which docs/benchmarks.md includes")
    for row in ratios:
        verdict = {True: "pass", False: "MISS", None: ""}[row.get("pass")]
        value = f"{row['ratio']:.3f}" if "ratio" in row else row.get("error", "")
        target = f"<= {row['target']:.2f}" if row.get("target") else ""
        wall = f"(epoch {row['epoch_wall_ratio']:.2f})" if "ratio" in row else ""
        _log(
            f"  {row['suite']:>18} {row['name']:>22} {value:>8} {target:>8} "
            f"{verdict:4} {wall}"
        )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Parses the command line and runs the benchmarks."""
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="kerastower benchmarks"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a small smoke run (tests use it)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="output folder (default: bench/results/)",
    )
    parser.add_argument("--repeats", type=int, help="timed repeats per variant")
    parser.add_argument("--steps", type=int, help="steps per timed epoch")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.repeats is not None:
        settings = dataclasses.replace(settings, repeats=args.repeats)
    if args.steps is not None:
        settings = dataclasses.replace(settings, steps=args.steps)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run(settings, args.out, quick=args.quick)
