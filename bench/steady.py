"""``python -m bench.steady``: the traced tower's steady step against copies.

`bench.trace` times each setup in a process of its own, one after the
other; on a machine whose 2 cores run 8 logical CPUs, the steady steps of
one setup moved by 2-3x between its runs, more than the difference it is
meant to show. Here the two designs of one path train side by side in one
process: the tower traced once and called on every device (``tower4``,
the default path; ``replicas4``, with ``replicate_variables=True``;
``unsynced4``, the default path with ``sync_batch_norm=False``) against
one copy of the tower traced per tower (``copies4``, ``copies_replicas4``),
the design it replaced. Both are built, compiled
(SGD) and warmed up by one ``fit``; then each of `REPEATS` repeats runs
one ``fit`` epoch of 11 global batches of 8 examples on each, in turn, and
takes its median step (`bench.timing.time_epoch`). The ratio is the
median over the repeats of traced / copies, so load that hits one repeat
hits both designs.

Several workers (``workers4`` against ``copies_workers4``) run in processes
of their own and stay in `bench.trace`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.trace import (
    BATCH,
    DEFAULT_OUT,
    LOGICAL_DEVICES,
    MODELS,
    STEADY_STEPS,
    child_row,
    write_results,
)

# ``unsynced4``: the default path with ``sync_batch_norm=False``, both
# designs: what the synchronised `BatchNormalization` costs each.
PATHS = {
    "tower4": {},
    "replicas4": {"replicate_variables": True},
    "unsynced4": {"sync_batch_norm": False},
}
REPEATS = 7


def _child(model_name: str, path: str, repeats: int) -> None:
    """Times `path` and its copies in this (fresh) process; one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np

    import kerastower
    from bench.timing import time_epoch
    from bench.trace import build
    from kerastower.step import traced_towers

    kerastower.configure_logical_devices(LOGICAL_DEVICES)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    traced = traced_towers.applies
    models = {}
    for design in ("traced", "copies"):
        keras.utils.set_random_seed(0)
        model, x, y = build(model_name)
        model = kerastower.TowerModel.from_model(model, towers=4, **PATHS[path])
        model.compile(optimizer="sgd", loss=loss)
        # The step is traced by the first fit, under the design set now.
        traced_towers.applies = traced if design == "traced" else lambda *a: False
        try:
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        finally:
            traced_towers.applies = traced
        models[design] = model
    x = np.concatenate([x] * (STEADY_STEPS + 1))
    y = np.concatenate([y] * (STEADY_STEPS + 1))
    steps: dict[str, list[float]] = {design: [] for design in models}
    for _ in range(repeats):
        for design, model in models.items():
            steps[design].append(time_epoch(model, x, y, BATCH)[0])
    ratios = [t / c for t, c in zip(steps["traced"], steps["copies"])]
    row = {
        "model": model_name,
        "path": path,
        "traced_step_s": statistics.median(steps["traced"]),
        "copies_step_s": statistics.median(steps["copies"]),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
    }
    print("RESULT " + json.dumps(row), flush=True)


def measure(model_name: str, path: str, repeats: int = REPEATS) -> dict[str, Any]:
    """Runs `path` of `model_name` against its copies in a fresh process."""
    command = [sys.executable, "-m", "bench.steady", "--child", model_name, path]
    command += ["--repeats", str(repeats)]
    return child_row(command, {"model": model_name, "path": path})


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| model | path | traced once (ms) | copies (ms) | traced / copies |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['path']} | error: {r['error']} |||")
            continue
        spread = f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}"
        lines.append(
            f"| {r['model']} | {r['path']} | {1e3 * r['traced_step_s']:.0f} "
            f"| {1e3 * r['copies_step_s']:.0f} | {r['ratio']:.2f} ({spread}) |"
        )
    return "\n".join(lines) + "\n"


def run(
    models: Sequence[str],
    paths: Sequence[str],
    out: Path,
    repeats: int = REPEATS,
    log=print,
) -> dict[str, Any]:
    """Measures every path of every model; writes ``steady.json`` and ``.md``."""
    started = time.perf_counter()
    rows = []
    for model_name in models:
        for path in paths:
            log(f"[steady] {model_name} {path}")
            rows.append(measure(model_name, path, repeats))
            log(f"[steady]   {rows[-1]}")
    table = markdown_table(rows)
    return write_results(out, "steady", rows, table, started, repeats=repeats)


def main(argv: Sequence[str] | None = None) -> None:
    """Parses the command line, measures and prints the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.steady",
        description="steady step of the tower traced once against one copy per tower",
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS[:3]))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child, args.repeats)
        return
    results = run(
        args.models,
        args.paths,
        args.out,
        args.repeats,
        log=lambda message: print(message, file=sys.stderr, flush=True),
    )
    print(markdown_table(results["rows"]), end="")
    print(f"written to {args.out / 'steady.json'} and {args.out / 'steady.md'}")


if __name__ == "__main__":
    main()
