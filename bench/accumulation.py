"""The cost of one micro-step of gradient accumulation.

Compares `kerastower.TowerModel` trained with
`kerastower.callbacks.GradientAccumulation(k)` against the same model without
it, at the same global micro-batch size: each accumulated micro-step adds its
gradients to the accumulators, and every ``k``-th applies them, so the mean
over all steps (not the median) is the fair step time here.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import kerastower
import kerastower.callbacks
from bench.timing import time_epoch
from bench.workloads import Variant, Workload, build_variant


def run_accumulation(
    workload: Workload,
    towers: int,
    accumulation_steps: int,
    steps: int,
    repeats: int,
    log=print,
) -> dict[str, Any]:
    """Times micro-steps with and without accumulation, interleaved.

    Args:
        workload: The model; its batch size is the global micro-batch size.
        towers: Towers of both models.
        accumulation_steps: ``k``, micro-batches per update.
        steps: Micro-steps per timed epoch; a multiple of ``k`` keeps windows
            whole.
        repeats: Timed epochs per variant.
        log: Called with progress lines.

    Returns:
        Raw seconds per micro-step, their medians and the ratio
        ``accumulated / plain``; ``{"status": "not available"}`` when
        `kerastower.callbacks` has no `GradientAccumulation`.
    """
    callback_class = getattr(kerastower.callbacks, "GradientAccumulation", None)
    if callback_class is None:
        log("  GradientAccumulation: not available")
        return {"status": "not available"}
    x, y = workload.data(steps)
    variant = Variant("tower", towers)

    def accumulating():
        return [callback_class(accumulation_steps)]

    start = time.perf_counter()
    plain = build_variant(workload, variant)
    accumulated = build_variant(workload, variant)
    time_epoch(plain, x, y, workload.batch_size)
    time_epoch(accumulated, x, y, workload.batch_size, callbacks=accumulating())
    times: dict[str, list[float]] = {"plain": [], "accumulated": []}
    for _ in range(repeats):
        step, _ = time_epoch(plain, x, y, workload.batch_size, statistic="mean")
        times["plain"].append(step)
        step, _ = time_epoch(
            accumulated,
            x,
            y,
            workload.batch_size,
            callbacks=accumulating(),
            statistic="mean",
        )
        times["accumulated"].append(step)
    per_repeat = [a / p for a, p in zip(times["accumulated"], times["plain"])]
    result = {
        "status": "measured",
        "workload": workload.name,
        "towers": towers,
        "accumulation_steps": accumulation_steps,
        "micro_batch_size": workload.batch_size,
        "steps_per_epoch": steps,
        "repeats_s": times,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "ratio": statistics.median(per_repeat),
        "per_repeat": per_repeat,
        "seconds": time.perf_counter() - start,
    }
    log(
        f"  micro-step with GradientAccumulation({accumulation_steps}) / "
        f"plain step: {result['ratio']:.3f}"
    )
    return result
