"""``python -m bench.trace_once``: what tracing a tower's step once would save.

A design experiment for the first step's time (`bench.trace` measures
`TowerModel` itself). Each mechanism runs in a fresh process on 4 logical
CPUs and takes one SGD step of the same model on the same batch of 8, built
by hand (no `TowerModel`, no synchronised statistics), so that only the way
the towers are traced differs:

- ``plain``: one device; the step's function differentiates the whole batch;
- ``copies``: ``N`` towers as `TowerModel` and `MirroredStrategy` build
  them: the step's function traces the forward and backward pass once per
  tower, under each tower's device, so its graph holds ``N`` copies;
- ``once``: the tower's forward and backward pass is traced once, as a
  concrete function of the weights' values and a shard, and the step calls
  it ``N`` times, once under each tower's device; TensorFlow inlines the
  calls before it optimises the graph;
- ``once_noinline``: the same calls, not inlined (``_noinline``): each call
  runs the function instantiated on its device;
- ``once_sync``: ``once_noinline`` with `BatchNormalization` normalising
  with the statistics of the whole batch, as `TowerModel` does by default:
  `kerastower.step.batch_norm.global_moments`, whose sums over the towers
  are collectives (``CollectiveReduceV2``, one per dtype and sum, in the
  forward and the backward pass) inside the function traced once. Its loss
  is ``plain``'s. TensorFlow's automatic control dependencies would chain
  the towers' calls (each holds stateful collectives), and the first call's
  collectives would wait forever for the others: each call is marked to run
  independently;
- ``once_sync_no_grappler``: ``once_sync`` with TensorFlow's graph optimiser
  (Grappler) off for the whole process, to show what it costs: it optimises
  the tower function once per device, and the outer step's optimisation
  works on the function library too;
- ``once_sync_towers_no_grappler``: ``once_sync`` with Grappler off for the
  towers' calls only (`kerastower._keras_compat.calls_without_graph_optimizer`):
  what a step could do without changing the user's process.

Each row gives the time to trace the tower function (the ``once``
mechanisms only), to trace the step, the first call (TensorFlow's graph
optimisation, placement and the step itself), their total (what a user
waits for), the ops in the step's own graph, the mean of the next 5 steps,
and the first step's loss (each tower normalises with its own
shard's statistics, except in the ``once_sync`` mechanisms, so the others
agree with each other, not with ``plain``; ``once_sync`` agrees with
``plain``). The ratio is the total over ``plain``'s, in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.trace import build

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results"
MECHANISMS = (
    "plain",
    "copies",
    "once",
    "once_noinline",
    "once_sync",
    "once_sync_no_grappler",
    "once_sync_towers_no_grappler",
)
# Any group key that no strategy of the process uses: the bench makes none.
GROUP_KEY = 4242
STEADY_STEPS = 5


def _synchronise_batch_norm(model, towers: int) -> None:
    """Makes every `BatchNormalization` of `model` normalise with the
    statistics of all towers, summed by collectives among `towers` devices."""
    import functools

    import keras
    import tensorflow as tf

    from kerastower import _keras_compat
    from kerastower.reduce.towers import sum_by_dtype
    from kerastower.step.batch_norm import global_moments

    instance_keys = iter(range(1, 1 << 30))

    def collective_sum(values):
        """One all-reduce per dtype; every tower calls it in the same order
        (once, while the function is traced), so the keys match."""

        def collective(flat):
            return tf.raw_ops.CollectiveReduceV2(
                input=flat,
                group_size=towers,
                group_key=GROUP_KEY,
                instance_key=next(instance_keys),
                ordering_token=[],
                merge_op="Add",
                final_op="Id",
            )

        return sum_by_dtype(values, collective)

    moments = functools.partial(global_moments, total=collective_sum)
    for layer in _keras_compat.inner_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            _keras_compat.override_batch_norm_moments(layer, moments)


LOGICAL_DEVICES = 4


def _child(model_name: str, mechanism: str, towers: int) -> None:
    """Times one mechanism in this (fresh) process; prints one JSON line."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    import kerastower
    from kerastower import _keras_compat

    kerastower.configure_logical_devices(LOGICAL_DEVICES)
    if mechanism == "once_sync_no_grappler":
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    keras.utils.set_random_seed(0)
    model, x, y = build(model_name)
    x, y = tf.constant(x), tf.constant(y.astype("int32"))
    towers = 1 if mechanism == "plain" else towers
    devices = kerastower.available_devices()[:towers]
    variables = list(model.trainable_variables)
    states = list(model.non_trainable_variables)
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    sync = mechanism.startswith("once_sync")
    if sync:
        _synchronise_batch_norm(model, towers)

    def tower(values, state_values, x, y):
        """One tower's loss, gradients and layer-state updates, reading the
        weights from `values` rather than from the variables."""
        mapping = list(zip(variables, values)) + list(zip(states, state_values))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            with tf.GradientTape() as tape:
                tape.watch(values)
                loss = keras.ops.mean(loss_fn(y, model(x, training=True)))
                loss = loss / towers  # the towers' losses add up to the batch's
            gradients = tape.gradient(loss, values)
            updates = [scope.get_current_value(v) for v in states]
        updates = [s if u is None else u for u, s in zip(updates, state_values)]
        return loss, gradients, updates

    started = time.perf_counter()
    call = tower
    if mechanism.startswith("once"):
        noinline = {"_noinline": True} if mechanism != "once" else None
        traced = tf.function(tower, experimental_attributes=noinline)

        def spec(tensor):
            return tf.TensorSpec(tensor.shape, tensor.dtype)

        call = traced.get_concrete_function(
            [spec(v.value) for v in variables],
            [spec(v.value) for v in states],
            tf.TensorSpec((x.shape[0] // towers, *x.shape[1:]), x.dtype),
            tf.TensorSpec((y.shape[0] // towers,), y.dtype),
        )
    tower_trace = time.perf_counter() - started

    @tf.function
    def step(x, y):
        values = [v.value for v in variables]
        state_values = [v.value for v in states]
        outs = []
        optimised = contextlib.nullcontext()
        if mechanism == "once_sync_towers_no_grappler":
            optimised = _keras_compat.calls_without_graph_optimizer()
        with optimised:
            shards = zip(devices, tf.split(x, towers), tf.split(y, towers))
            for device, xs, ys in shards:
                with tf.device(device):
                    outs.append(call(values, state_values, xs, ys))
                if sync:
                    _keras_compat.run_independently(outs[-1][0].op)
        gradients = [tf.add_n(list(g)) for g in zip(*[o[1] for o in outs])]
        optimizer.apply_gradients(zip(gradients, variables))
        for variable, update in zip(states, outs[0][2]):
            variable.assign(update)
        return tf.add_n([o[0] for o in outs])

    started = time.perf_counter()
    concrete = step.get_concrete_function(x, y)
    step_trace = time.perf_counter() - started
    started = time.perf_counter()
    loss = float(step(x, y).numpy())
    first_call = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(STEADY_STEPS):
        step(x, y).numpy()
    steady = (time.perf_counter() - started) / STEADY_STEPS
    row = {
        "model": model_name,
        "mechanism": mechanism,
        "towers": towers,
        "tower_trace_s": tower_trace,
        "step_trace_s": step_trace,
        "first_call_s": first_call,
        "total_s": tower_trace + step_trace + first_call,
        "step_ops": len(concrete.graph.get_operations()),
        "steady_step_ms": steady * 1e3,
        "loss": loss,  # the first step's
    }
    print("RESULT " + json.dumps(row), flush=True)


def measure(model_name: str, mechanism: str, towers: int) -> dict[str, Any]:
    """Runs `_child` in a fresh process and returns its row."""
    command = [sys.executable, "-m", "bench.trace_once", "--child"]
    command += [model_name, mechanism, str(towers)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{mechanism} on {model_name} failed:\n{done.stderr[-2000:]}")


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds each row's total over ``plain``'s, per model."""
    plain = {r["model"]: r for r in rows if r["mechanism"] == "plain"}
    for row in rows:
        if row["model"] in plain:
            row["total_ratio"] = row["total_s"] / plain[row["model"]]["total_s"]
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| model | mechanism | towers | trace tower (s) | trace step (s) "
        "| first call (s) | total (s) | x plain | ops in the step "
        "| steady step (ms) | first loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['total_ratio']:.2f}" if "total_ratio" in r else ""
        lines.append(
            f"| {r['model']} | {r['mechanism']} | {r['towers']} "
            f"| {r['tower_trace_s']:.2f} | {r['step_trace_s']:.2f} "
            f"| {r['first_call_s']:.2f} | {r['total_s']:.2f} | {ratio} "
            f"| {r['step_ops']} | {r['steady_step_ms']:.1f} | {r['loss']:.6f} |"
        )
    return "\n".join(lines) + "\n"


def run(models: Sequence[str], towers: int, out: Path, log=print) -> dict[str, Any]:
    """Measures every mechanism for every model; writes ``trace_once.json``
    and ``trace_once.md`` to `out`."""
    from bench.report import machine_info

    started = time.perf_counter()
    rows = []
    for model_name in models:
        for mechanism in MECHANISMS:
            log(f"[trace_once] {model_name} {mechanism}")
            rows.append(measure(model_name, mechanism, towers))
    results = {
        "meta": {
            "command": " ".join(["python -m bench.trace_once", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "global_batch_size": 8,
            "method": "see the docstring of bench/trace_once.py",
            "machine": machine_info(),
            "seconds": time.perf_counter() - started,
        },
        "rows": with_ratios(rows),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace_once.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "trace_once.md").write_text(markdown_table(results["rows"]))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Parses the command line, measures and prints the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.trace_once",
        description="first-step time of towers traced once against traced per tower",
    )
    parser.add_argument(
        "--models", nargs="+", default=["convbn", "resnet50"], help="models"
    )
    parser.add_argument("--towers", type=int, default=4)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model_name, mechanism, towers = args.child
        _child(model_name, mechanism, int(towers))
        return
    results = run(args.models, args.towers, args.out)
    print(markdown_table(results["rows"]), end="")
    print(f"written to {args.out / 'trace_once.json'} and trace_once.md")


if __name__ == "__main__":
    main()
