"""Step times of several variants, measured side by side.

Every variant is built, compiled and warmed up (one `fit` epoch, which traces
its train function) before timing. Then each repeat runs one `fit` epoch of
every variant back to back, so that load from other processes on the machine
hits all variants alike. A callback stamps the wall time after every call of
the train function; the first call of an epoch (iterator start-up) is left
out, and the step time of a repeat is the median over the remaining calls of
``elapsed / steps``, where one call runs `steps_per_execution` steps.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from bench.workloads import Variant, Workload, build_variant, describe_error

RESULTS = Path(__file__).resolve().parent / "results"


class StepTimer(keras.callbacks.Callback):
    """Records ``(end_step, perf_counter())`` after every train-function call."""

    def __init__(self):
        super().__init__()
        self.stamps: list[tuple[int, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.stamps.append((batch, time.perf_counter()))

    def step_times(self) -> list[float]:
        """Seconds per step of each call after the first."""
        return [
            (t1 - t0) / (b1 - b0)
            for (b0, t0), (b1, t1) in zip(self.stamps, self.stamps[1:])
        ]


def time_epoch(
    model: keras.Model,
    x,
    y,
    batch_size: int,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    statistic: str = "median",
) -> tuple[float, float]:
    """Runs one `fit` epoch and returns its seconds per step and its wall time.

    Args:
        model: A compiled model.
        x: Inputs.
        y: Targets.
        batch_size: The global batch size.
        callbacks: More callbacks for `fit`.
        statistic: ``"median"`` or ``"mean"`` of the per-call step times (the
            mean counts steps that do more work than most, such as every
            ``k``-th step of gradient accumulation). Defaults to ``"median"``.

    Returns:
        ``(seconds per step, seconds of the whole fit call)``; the second
        includes what every epoch pays once (the input pipeline, which stock
        `MirroredStrategy` distributes to its replicas).
    """
    timer = StepTimer()
    start = time.perf_counter()
    model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[timer, *callbacks],
    )
    wall = time.perf_counter() - start
    if statistic == "mean":
        return statistics.fmean(timer.step_times()), wall
    return statistics.median(timer.step_times()), wall


def run_suite(
    workload: Workload,
    variants: Sequence[Variant],
    steps: int,
    repeats: int,
    log=print,
) -> dict[str, Any]:
    """Times `variants` of `workload`, interleaved over `repeats`.

    Args:
        workload: The model and data.
        variants: The variants to compare; a variant that fails to build or to
            train is recorded with its error and left out of the timing.
        steps: Steps per timed epoch (global batches of
            ``workload.batch_size`` examples).
        repeats: Timed epochs per variant.
        log: Called with progress lines.

    Returns:
        ``{"variants": {name: {...}}, ...}`` with, per variant, the seconds per
        step of every repeat (``"repeats_s"``), their median (``"median_s"``),
        the wall time of every timed `fit` epoch (``"epoch_wall_s"``) and the
        warm-up time; or ``{"error": ...}`` for a variant that failed.
    """
    x, y = workload.data(steps)
    models: dict[str, keras.Model] = {}
    results: dict[str, dict[str, Any]] = {}
    for variant in variants:
        start = time.perf_counter()
        try:
            model = build_variant(workload, variant)
            time_epoch(model, x, y, workload.batch_size)
        except Exception as error:  # recorded in the results, not fatal
            message = describe_error(error)
            log(f"  {variant.name}: failed ({message})")
            results[variant.name] = {"error": message}
            continue
        models[variant.name] = model
        results[variant.name] = {
            "warmup_s": time.perf_counter() - start,
            "repeats_s": [],
            "epoch_wall_s": [],
        }
    for _ in range(repeats):
        for name, model in models.items():
            step, wall = time_epoch(model, x, y, workload.batch_size)
            results[name]["repeats_s"].append(step)
            results[name]["epoch_wall_s"].append(wall)
    for name in models:
        results[name]["median_s"] = statistics.median(results[name]["repeats_s"])
        repeats_ms = ", ".join(f"{1e3 * t:.2f}" for t in results[name]["repeats_s"])
        log(
            f"  {name:>14}: {1e3 * results[name]['median_s']:7.2f} ms/step "
            f"(repeats {repeats_ms})"
        )
    return {
        "workload": workload.name,
        "description": workload.description,
        "batch_size": workload.batch_size,
        "steps_per_epoch": steps,
        "repeats": repeats,
        "variants": results,
    }


def paired_ratio(suite: dict[str, Any], numerator: str, denominator: str) -> dict:
    """The step-time ratio of two variants of one suite.

    Args:
        suite: A result of `run_suite`.
        numerator: Variant name, e.g. ``"tower2"``.
        denominator: Variant name, e.g. ``"plain"``.

    Returns:
        ``{"ratio": median over repeats of the per-repeat ratio,
        "ratio_of_medians": ..., "per_repeat": [...], "epoch_wall_ratio": the
        same median for whole `fit` epochs}``, or ``{"error": ...}`` when
        either variant failed.
    """
    variants = suite["variants"]
    a, b = variants.get(numerator, {}), variants.get(denominator, {})
    for name, result in ((numerator, a), (denominator, b)):
        if "median_s" not in result:
            return {"error": f"{name}: {result.get('error', 'not measured')}"}
    per_repeat = [u / v for u, v in zip(a["repeats_s"], b["repeats_s"])]
    ratio = {
        "ratio": float(np.median(per_repeat)),
        "ratio_of_medians": a["median_s"] / b["median_s"],
        "per_repeat": per_repeat,
    }
    if "epoch_wall_s" in a and "epoch_wall_s" in b:
        walls = [u / v for u, v in zip(a["epoch_wall_s"], b["epoch_wall_s"])]
        ratio["epoch_wall_ratio"] = float(np.median(walls))
    return ratio


def interleaved_main(
    name: str,
    run: Any,
    markdown: Any,
    argv: list[str] | None = None,
    steps: int = 50,
    out: Path | None = None,
) -> int:
    """The command line of ``python -m bench.NAME``, a benchmark that times
    its variants interleaved in one process on 4 logical CPUs.

    Parses ``--batch``, ``--steps``, ``--repeats``, ``--out`` and ``--quick``
    (2 repeats of 5 steps), runs ``run(batch, steps, repeats)``, and writes
    its result to ``NAME.json`` and ``markdown(result)`` to ``NAME.md``.
    """
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=out or RESULTS)
    parser.add_argument("--quick", action="store_true", help="2 repeats of 5 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 5, 2

    import kerastower

    kerastower.configure_logical_devices(4)
    result = run(args.batch, args.steps, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(markdown(result) + "\n")
    print(markdown(result))
    return 0
