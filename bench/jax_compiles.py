"""``python -m bench.jax_compiles``: what a `fit` compiles on Keras's JAX
backend, `TowerModel` against one device and `keras.distribution.DataParallel`.

Each setup runs in its own process on ``N`` CPU devices of JAX's own
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``), one `fit` of one
epoch on ``3 * 32 + 29`` examples, global batch 32: three batches that
divide by 1, 2 and 4 devices and a last one of 29 that does not. Measured:

- **compiles**: how many times JAX traced the train step (a counter in a
  ``train_step`` override, which runs only while JAX traces);
- **first fit**: the seconds of that `fit`, compilation included;
- **step**: a second `fit`'s seconds per batch, nothing left to compile.

``plain`` is the `keras.Model` on one device; ``towersN`` `TowerModel` on
``N`` devices; ``data_parallelN`` the model under Keras's own
``keras.distribution.DataParallel`` on ``N`` devices, which refuses the last
batch (`IndivisibleError`): its row says so, and its first fit is the
refused one and a second on the 96 examples that divide, together.
``--model resnet50`` trains ``keras.applications.ResNet50(weights=None)`` on
32x32 images (issue 55's anchor); the default, a small convnet, takes
seconds. Logical CPUs share this machine's cores: the times show
compilation, not a speed-up. Results go to ``jax_compiles.json`` and
``jax_compiles.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPS = ["plain", "towers1", "towers2", "towers4", "data_parallel4"]
BATCH, FULL_BATCHES, LAST = 32, 3, 29


def _layers(keras, model_name: str):
    inputs = keras.Input((32, 32, 3))
    if model_name == "resnet50":
        net = keras.applications.ResNet50(
            weights=None,
            input_shape=(32, 32, 3),
            classes=10,
            classifier_activation=None,
        )
        return inputs, net(inputs)
    h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Conv2D(32, 3, strides=2, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return inputs, keras.layers.Dense(10)(h)


def measure(setup: str, model_name: str) -> dict:
    """One setup's compiles, first fit and step, in this process."""
    import keras
    import numpy as np

    import kerastower

    traces = []

    class Counted:
        def train_step(self, state, data):
            traces.append(1)
            return super().train_step(state, data)

    devices = int("".join(filter(str.isdigit, setup)) or 1)
    keras.utils.set_random_seed(0)
    if setup.startswith("data_parallel"):
        distribution = keras.distribution.DataParallel()
        keras.distribution.set_distribution(distribution)
    inputs, outputs = _layers(keras, model_name)
    if setup.startswith("towers"):
        model = type("Towers", (Counted, kerastower.TowerModel), {})(
            inputs, outputs, towers=devices
        )
    else:
        model = type("Plain", (Counted, keras.Model), {})(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    n = BATCH * FULL_BATCHES + LAST
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, (n,))
    row = {"setup": setup, "devices": devices}
    start = time.perf_counter()
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    except Exception as error:  # DataParallel on the last batch
        row["last_batch"] = f"{type(error).__name__}"
        x, y = x[: BATCH * FULL_BATCHES], y[: BATCH * FULL_BATCHES]
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    row["first_fit_s"] = round(time.perf_counter() - start, 2)
    row["compiles"] = len(traces)
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    float(model.trainable_variables[-1].numpy().ravel()[0])
    row["step_ms"] = round(
        (time.perf_counter() - start) * 1000 / -(-len(x) // BATCH), 1
    )
    row["compiles_after_second_fit"] = len(traces)
    return row


def _child(setup: str, model_name: str) -> dict:
    devices = int("".join(filter(str.isdigit, setup)) or 1)
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    command = [
        sys.executable,
        "-m",
        "bench.jax_compiles",
        "--setup",
        setup,
        "--model",
        model_name,
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"setup": setup, "error": done.stderr[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: dict) -> str:
    """The results as a Markdown table."""
    lines = [
        f"What a fit compiles on JAX ({results['model']}, batch {BATCH}: "
        f"{FULL_BATCHES} batches and a last one of {LAST})",
        "",
        "| setup | devices | compiles | first fit (s) | step (ms) | last batch |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["rows"]:
        if "error" in r:
            lines.append(f"| {r['setup']} | | error | | | |")
            continue
        lines.append(
            f"| {r['setup']} | {r['devices']} | {r['compiles']} | {r['first_fit_s']} "
            f"| {r['step_ms']} | {r.get('last_batch', 'trained')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jax_compiles")
    parser.add_argument("--model", choices=["convnet", "resnet50"], default="convnet")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.setup:
        print(json.dumps(measure(args.setup, args.model)))
        return
    results = {"model": args.model, "rows": [_child(s, args.model) for s in SETUPS]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "jax_compiles.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "jax_compiles.md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
