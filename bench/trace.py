"""``python -m bench.trace``: time to the first training step, and steady steps.

Every setup runs in a fresh process on 8 logical CPUs: it builds the model,
compiles it (SGD) and times

- **first step**: one ``fit`` of one global batch, from the call to the
  end of its batch (``on_train_batch_end``, when the progress bar moves):
  tracing the training step, TensorFlow's graph optimisation and the step
  itself. Not what ``fit`` does after it: closing its `tf.data` iterator
  waited up to 2.5 s, now and then, for the thread that autotunes the
  pipeline, on the plain model as on towers (a stack dump of the gap);
- **steady step**: the median time between the ends of consecutive steps
  of a second ``fit``, of 11 batches (10 intervals), the path a user's epochs
  take (``train_on_batch`` calls another step function, traced anew, and
  converts its data on every call).

Setups: ``plain`` (a `keras.Model` on one device), ``towerN``
(`kerastower.TowerModel` over ``N`` logical CPUs, synchronised
`BatchNormalization`, the default), ``replicasN`` (the same with
``replicate_variables=True``, the default where the towers are GPUs),
``xlaN`` (the same with ``jit_compile=True``), ``workersN`` (``N``
towers over 2 local workers, `kerastower launch`, each training on its half
of the global batch; the chief's times), ``copies4``,
``copies_replicas4`` and ``copies_workers4`` (the default, the replicas
and the workers path as they ran before the tower was traced once: one copy
of the tower traced per tower, the baseline their steady step is held to)
and ``mirrored4`` (stock
`tf.distribute.MirroredStrategy` over 4 logical CPUs, unsynchronised
`BatchNormalization`). Models: ``resnet50`` and ``densenet121``
(`keras.applications`, 32x32x3 inputs, 5 classes, no weights), ``transformer``
(12 blocks of self-attention and a feed-forward layer, 16 tokens of width 64)
and ``convbn`` (16 blocks of a 3x3 convolution, `BatchNormalization` and
ReLU, for ``--quick``). The global batch is 8 examples.

Each setup runs ``--repeats`` times (3), the setups of a model in turn,
and its row holds the medians (its first steps' range in brackets): one
process's first step moved by up to 1.5 times between runs here.
The ratios are each setup's medians over ``plain``'s for the same model, in
the same run. Logical CPUs share the machine's cores, so steady steps of towers
are not faster here; the first step measures tracing, which is what grows
with the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results"
MODELS = ("resnet50", "densenet121", "transformer", "convbn")
SETUPS = (
    "plain",
    "tower2",
    "tower4",
    "tower8",
    "replicas2",
    "replicas4",
    "replicas8",
    "xla4",
    "workers4",
    "copies4",
    "copies_replicas4",
    "copies_workers4",
    "mirrored4",
)
# A setup's name: its kind, then its number of towers.
_TOWER_OPTIONS = {
    "tower": {},
    "replicas": {"replicate_variables": True},
    "xla": {"jit_compile": True},
    "workers": {},
    "copies": {},
    "copies_replicas": {"replicate_variables": True},
    "copies_workers": {},
}
# Setups whose towers are traced one copy each, as before the trace once.
_COPIES = ("copies", "copies_replicas", "copies_workers")
# ``workersN``: N towers over this many local workers (`kerastower launch`).
WORKERS = 2
BATCH = 8
STEADY_STEPS = 10
LOGICAL_DEVICES = 8
REPEATS = 3


def build(name: str):
    """The model `name` of `MODELS`, and one batch of data for it."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    if name in ("resnet50", "densenet121"):
        app = {
            "resnet50": keras.applications.ResNet50,
            "densenet121": keras.applications.DenseNet121,
        }[name]
        model = app(input_shape=(32, 32, 3), weights=None, classes=5)
        x = rng.normal(size=(BATCH, 32, 32, 3)).astype("float32")
        return model, x, rng.integers(0, 5, size=(BATCH,))
    if name == "transformer":
        inputs = keras.Input((16, 64))
        h = inputs
        for _ in range(12):
            attended = keras.layers.MultiHeadAttention(4, 16)(h, h)
            h = keras.layers.LayerNormalization()(h + attended)
            hidden = keras.layers.Dense(128, activation="relu")(h)
            h = keras.layers.LayerNormalization()(h + keras.layers.Dense(64)(hidden))
        outputs = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling1D()(h))
        x = rng.normal(size=(BATCH, 16, 64)).astype("float32")
        return keras.Model(inputs, outputs), x, rng.integers(0, 5, size=(BATCH,))
    inputs = keras.Input((16, 16, 3))
    h = inputs
    for _ in range(16):
        h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(h)
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
    outputs = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(h))
    x = rng.normal(size=(BATCH, 16, 16, 3)).astype("float32")
    return keras.Model(inputs, outputs), x, rng.integers(0, 5, size=(BATCH,))


def _child(model_name: str, setup: str) -> None:
    """Measures one setup in this (fresh) process; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf

    import kerastower

    kind = setup.rstrip("0123456789")
    on_workers = kind.endswith("workers")
    if not on_workers:  # a worker's logical CPUs are the launcher's
        kerastower.configure_logical_devices(LOGICAL_DEVICES)
    keras.utils.set_random_seed(0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    started = time.perf_counter()
    if setup.startswith("mirrored"):
        devices = kerastower.available_devices()[: int(setup[len("mirrored") :])]
        with tf.distribute.MirroredStrategy(devices).scope():
            model, x, y = build(model_name)
            model.compile(optimizer="sgd", loss=loss)
    else:
        model, x, y = build(model_name)
        if kind in _COPIES:
            from kerastower.step import traced_towers

            traced_towers.applies = lambda *args: False  # the plan makes copies
        if kind in _TOWER_OPTIONS:
            towers = int(setup[len(kind) :])
            if on_workers:  # each worker trains on its part of the batch
                towers //= WORKERS
                part = len(x) // WORKERS
                rows = slice(kerastower.worker_index() * part, None)
                x, y = x[rows][:part], y[rows][:part]
            model = kerastower.TowerModel.from_model(
                model, towers=towers, **_TOWER_OPTIONS[kind]
            )
        model.compile(optimizer="sgd", loss=loss)
    built = time.perf_counter()
    batch = len(x)  # BATCH, or one worker's part of it
    ends: list[float] = []
    batch_ends = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter())
    )
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[batch_ends])
    first, fitted = ends.pop(), time.perf_counter()
    copies = STEADY_STEPS + 1
    x, y = np.concatenate([x] * copies), np.concatenate([y] * copies)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=[batch_ends])
    steady = np.diff(ends)
    row = {
        "model": model_name,
        "setup": setup,
        "build_s": built - started,
        "first_step_s": first - built,
        "first_fit_s": fitted - built,
        "steady_step_s": float(np.median(steady)),
    }
    print("RESULT " + json.dumps(row), flush=True)


def measure(model_name: str, setup: str) -> dict[str, Any]:
    """Runs `setup` of `model_name` in a fresh process and returns its row."""
    command = [sys.executable, "-m", "bench.trace", "--child", model_name, setup]
    kind = setup.rstrip("0123456789")
    if kind.endswith("workers"):
        towers = int(setup[len(kind) :]) // WORKERS
        launcher = [sys.executable, "-m", "kerastower", "launch", "-n", str(WORKERS)]
        command = [*launcher, "--towers", str(towers), "-m", *command[2:]]
    return child_row(command, {"model": model_name, "setup": setup})


def child_row(command: list[str], names: dict[str, str]) -> dict[str, Any]:
    """Runs `command`, a measuring process, from the repository root and
    returns the row it printed (``RESULT {json}``; on workers, the chief's),
    or `names` with the last lines of its error."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        line = line.removeprefix("[worker 0] ")  # the chief's, on workers
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {**names, "error": " | ".join(tail)}


def write_results(
    out: Path, name: str, rows: list, table: str, started: float, **meta: Any
) -> dict[str, Any]:
    """Writes ``{name}.json`` (the rows, and the run's command, date,
    machine and duration beside `meta`) and ``{name}.md`` (`table`) to
    `out`; returns what the JSON holds."""
    from bench.report import machine_info

    results = {
        "meta": {
            "command": " ".join([f"python -m bench.{name}", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "global_batch_size": BATCH,
            **meta,
            "method": f"see the docstring of bench/{name}.py",
            "machine": machine_info(),
            "seconds": time.perf_counter() - started,
        },
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{name}.md").write_text(table)
    return results


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds each row's first and steady step over ``plain``'s, per model."""
    plain = {r["model"]: r for r in rows if r["setup"] == "plain" and "error" not in r}
    for row in rows:
        base = plain.get(row["model"])
        if base and "error" not in row:
            row["first_step_ratio"] = row["first_step_s"] / base["first_step_s"]
            row["steady_step_ratio"] = row["steady_step_s"] / base["steady_step_s"]
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| model | setup | first step (s) | x plain | steady step (ms) | x plain |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['setup']} | error: {r['error']} ||||")
            continue
        first = f"{r['first_step_ratio']:.2f}" if "first_step_ratio" in r else ""
        steady = f"{r['steady_step_ratio']:.2f}" if "steady_step_ratio" in r else ""
        spread = r.get("first_step_runs", [])
        runs = f" ({min(spread):.1f}-{max(spread):.1f})" if len(spread) > 1 else ""
        lines.append(
            f"| {r['model']} | {r['setup']} | {r['first_step_s']:.1f}{runs} | {first} "
            f"| {1000 * r['steady_step_s']:.0f} | {steady} |"
        )
    return "\n".join(lines) + "\n"


# The times of a row of `measure`, each the median of its runs in `medians`.
_TIMES = ("build_s", "first_step_s", "first_fit_s", "steady_step_s")


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One setup's row from its `runs` (rows of `measure`): the median of
    each time, and every run's first step; the first error, if any run
    failed."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    return {
        **runs[0],
        **{key: statistics.median(r[key] for r in runs) for key in _TIMES},
        "first_step_runs": [r["first_step_s"] for r in runs],
    }


def run(
    models: Sequence[str],
    setups: Sequence[str],
    out: Path,
    repeats: int = REPEATS,
    log=print,
) -> dict[str, Any]:
    """Measures every setup of every model `repeats` times, the setups of a
    model in turn; writes ``trace.json`` and ``.md``."""
    started = time.perf_counter()
    rows = []
    for model_name in models:
        runs: dict[str, list] = {setup: [] for setup in setups}
        for repeat in range(repeats):
            for setup in setups:
                log(f"[trace] {model_name} {setup} ({repeat + 1}/{repeats})")
                runs[setup].append(measure(model_name, setup))
                log(f"[trace]   {runs[setup][-1]}")
        rows += [medians(runs[setup]) for setup in setups]
    rows = with_ratios(rows)
    return write_results(
        out, "trace", rows, markdown_table(rows), started, repeats=repeats
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Parses the command line, measures and prints the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.trace",
        description="time to the first training step, plain vs towers vs stock",
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS[:3]))
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument(
        "--quick", action="store_true", help="the convbn model, plain and tower2, once"
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return
    if args.repeats < 1:
        parser.error(f"`--repeats` must be at least 1. Received: {args.repeats}")
    if args.quick:
        args.models, args.setups, args.repeats = ["convbn"], ["plain", "tower2"], 1
    results = run(
        args.models,
        args.setups,
        args.out,
        args.repeats,
        log=lambda message: print(message, file=sys.stderr, flush=True),
    )
    print(markdown_table(results["rows"]), end="")
    print(f"written to {args.out / 'trace.json'} and {args.out / 'trace.md'}")


if __name__ == "__main__":
    main()
