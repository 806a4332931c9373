"""``python -m bench.gpu``: ResNet-50 images per second on 1..all GPUs.

Trains ``keras.applications.ResNet50(weights=None)`` on synthetic
ImageNet-shaped data (224x224x3 ``uint8`` images, rescaled to [-1, 1] inside
the model, 1000 classes) and measures images per second for:

- ``plain``: the `keras.Model` on one device, no strategy (the reference);
- ``towerN``: `kerastower.TowerModel.from_model(model, towers=N)`;
- ``mirroredN``: the model built under stock
  ``tf.distribute.MirroredStrategy(<first N GPUs>)`` with its default
  cross-device ops (NCCL all-reduce on GPUs),

for ``N`` = 1, 2, 4, ... up to every visible GPU, each in float32 and in mixed
precision (``mixed_float16`` on GPUs, with Keras's loss scaling;
``mixed_bfloat16`` on CPUs). The batch size per device is fixed (64 by
default), so the **global** batch is ``N`` times it: weak scaling, as
multi-GPU training is used. Scaling efficiency is

``efficiency(N) = images_per_s(N) / (N * images_per_s(plain))``

with ``plain`` at the same precision. Every (setup, N) runs in its own process
(stock strategies in one process clash on collective keys, and GPU memory is
released between runs). Each run fits ``warmup + steps`` steps in one `fit`
call; the clock runs from the end of the last warm-up step to the end of the
last step, each end waiting for the step's loss, so queued GPU work is inside
the measured time. `TowerModel` keeps its default ``sync_batch_norm=True``
(statistics over the global batch, exactly as one device); stock
`MirroredStrategy` uses per-replica statistics, which is less work.

On a machine with GPUs::

    python -m bench.gpu                       # ResNet-50, 224x224, 1..all GPUs
    python -m bench.gpu --image-size 160 --batch-per-device 128 --steps 50

Without a GPU, ``--tiny`` runs the same code on two logical CPUs with a small
model (one residual block with `BatchNormalization`, 32x32 images, 10
classes) and a few steps: a test that the script works, not a measurement
(logical CPUs share the machine's cores). ``--tiny --model mobilenetv2``
trains ``keras.applications.MobileNetV2(alpha=0.35)`` instead (minutes on
CPUs: tracing its graph once per tower dominates). Results go to ``gpu.json``
and ``gpu.md`` in ``--out`` (``gpu.tiny.json`` and ``gpu.tiny.md`` for a tiny
run).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
SETUPS = ("plain", "tower", "mirrored")
MODELS = ("resnet50", "mobilenetv2", "tiny_resnet")
PRECISIONS = ("float32", "mixed")


@dataclasses.dataclass(frozen=True)
class Config:
    """What to train and for how long.

    Attributes:
        model: ``"resnet50"``, ``"mobilenetv2"`` (alpha 0.35) or
            ``"tiny_resnet"`` (one residual block, for smoke runs).
        image_size: Height and width of the square images.
        classes: Number of classes.
        batch_per_device: Examples per device and step; the global batch is
            ``N`` times this.
        steps: Timed steps.
        warmup: Steps before the clock starts (tracing, autotuning).
        tiny: Run on logical CPUs instead of GPUs.
        cpus: Logical CPUs of a ``tiny`` run.
    """

    model: str = "resnet50"
    image_size: int = 224
    classes: int = 1000
    batch_per_device: int = 64
    steps: int = 30
    warmup: int = 10
    tiny: bool = False
    cpus: int = 2


TINY = Config(
    model="tiny_resnet",
    image_size=32,
    classes=10,
    batch_per_device=8,
    steps=3,
    warmup=2,
    tiny=True,
)


def device_counts(available: int) -> list[int]:
    """``[1, 2, 4, ...]`` below `available`, then `available` itself."""
    counts, n = [], 1
    while n < available:
        counts.append(n)
        n *= 2
    return counts + [available] if available >= 1 else []


def add_scaling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds ``speedup`` and ``scaling_efficiency`` against ``plain``.

    Rows without a ``plain`` row of the same precision, or that failed, get
    neither.
    """
    reference = {
        r["precision"]: r["images_per_s"]
        for r in rows
        if r["setup"] == "plain" and "images_per_s" in r
    }
    for row in rows:
        single = reference.get(row["precision"])
        if single and "images_per_s" in row:
            row["speedup"] = row["images_per_s"] / single
            row["scaling_efficiency"] = row["speedup"] / row["devices"]
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per setup, device count and precision."""
    lines = [
        "| setup | devices | precision | global batch | images/s | step ms "
        "| speedup vs plain | scaling efficiency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            measured = f"failed: {r['error'][:120]} | | | |"
        else:
            speedup = f"{r['speedup']:.2f}" if "speedup" in r else ""
            efficiency = (
                f"{r['scaling_efficiency']:.0%}" if "scaling_efficiency" in r else ""
            )
            measured = (
                f"{r['images_per_s']:.1f} | {r['step_ms']:.1f} | {speedup} "
                f"| {efficiency} |"
            )
        lines.append(
            f"| {r['setup']} | {r['devices']} | {r['precision']} "
            f"| {r['global_batch']} | {measured}"
        )
    return "\n".join(lines) + "\n"


# -- One (setup, N) in a child process --------------------------------------------


def _tiny_resnet(shape, classes):
    """One residual block with `BatchNormalization`: the smoke-test model."""
    import keras

    layers = keras.layers
    inputs = keras.Input(shape)
    x = layers.Conv2D(8, 3, strides=2, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    y = layers.Conv2D(8, 3, padding="same", use_bias=False)(x)
    y = layers.ReLU()(layers.BatchNormalization()(y))
    y = layers.BatchNormalization()(layers.Conv2D(8, 3, padding="same")(y))
    x = layers.ReLU()(layers.Add()([x, y]))
    outputs = layers.Dense(classes)(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, outputs, name="tiny_resnet")


def _build(config: Config):
    import keras

    keras.utils.set_random_seed(0)
    shape = (config.image_size, config.image_size, 3)
    if config.model == "resnet50":
        base = keras.applications.ResNet50(
            weights=None,
            input_shape=shape,
            classes=config.classes,
            classifier_activation=None,
        )
    elif config.model == "mobilenetv2":
        base = keras.applications.MobileNetV2(
            alpha=0.35,
            weights=None,
            input_shape=shape,
            classes=config.classes,
            classifier_activation=None,
        )
    else:
        base = _tiny_resnet(shape, config.classes)
    images = keras.Input(shape, dtype="uint8")
    scaled = keras.layers.Rescaling(1 / 127.5, offset=-1)(images)
    return keras.Model(images, base(scaled), name=config.model)


def _measure(config: Config, setup: str, devices: int, precision: str) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import kerastower
    from bench.workloads import describe_error

    kind = "CPU" if config.tiny else "GPU"
    names = [d.name for d in tf.config.list_logical_devices(kind)][:devices]
    policy = "float32"
    if precision == "mixed":
        policy = "mixed_bfloat16" if config.tiny else "mixed_float16"
    global_batch = config.batch_per_device * devices
    row = {
        "setup": setup,
        "devices": devices,
        "precision": precision,
        "policy": policy,
        "global_batch": global_batch,
        "device_names": names,
    }

    class Clock(keras.callbacks.Callback):
        """Stamps the ends of the warm-up and of the last step, each after
        that step's loss is ready."""

        start = stop = None

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 in (config.warmup, config.warmup + config.steps):
                float(logs["loss"])
                if batch + 1 == config.warmup:
                    self.start = time.perf_counter()
                else:
                    self.stop = time.perf_counter()

    # The previous precision's model must not hold on to device memory.
    keras.backend.clear_session()
    gc.collect()
    keras.mixed_precision.set_global_policy(policy)
    try:

        def compiled(model):
            model.compile(
                optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=False,
            )
            return model

        if setup == "plain":
            model = compiled(_build(config))
        elif setup == "tower":
            model = compiled(
                kerastower.TowerModel.from_model(_build(config), towers=names)
            )
        else:
            with tf.distribute.MirroredStrategy(names).scope():
                model = compiled(_build(config))
        rng = np.random.default_rng(0)
        size = config.image_size
        x = rng.integers(0, 256, (global_batch, size, size, 3), dtype=np.uint8)
        y = rng.integers(0, config.classes, (global_batch,)).astype("int32")
        data = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .repeat()
            .batch(global_batch, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
        clock = Clock()
        model.fit(
            data,
            steps_per_epoch=config.warmup + config.steps,
            epochs=1,
            verbose=0,
            callbacks=[clock],
        )
        seconds = clock.stop - clock.start
        row["images_per_s"] = config.steps * global_batch / seconds
        row["step_ms"] = 1e3 * seconds / config.steps
    except Exception as error:  # recorded in the results, not fatal
        row["error"] = describe_error(error)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return row


def _child(config: Config, setup: str, devices: int, precisions: Sequence[str]):
    if config.tiny:
        import kerastower

        kerastower.configure_logical_devices(config.cpus)
    rows = [_measure(config, setup, devices, p) for p in precisions]
    print(json.dumps(rows))


def _probe(config: Config) -> None:
    if config.tiny:
        import kerastower

        kerastower.configure_logical_devices(config.cpus)
    import tensorflow as tf

    from bench.report import machine_info

    kind = "CPU" if config.tiny else "GPU"
    names = [d.name for d in tf.config.list_logical_devices(kind)]
    gpus = [
        tf.config.experimental.get_device_details(g).get("device_name", "GPU")
        for g in tf.config.list_physical_devices("GPU")
    ]
    print(json.dumps({"devices": names, "gpus": gpus, "machine": machine_info()}))


def _call(config: Config, *args: str, timeout: int = 1800) -> Any:
    settings = json.dumps(dataclasses.asdict(config))
    command = [sys.executable, "-m", "bench.gpu", "--config", settings, *args]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    process = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if process.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(args)}` failed with exit code {process.returncode}:\n"
            + process.stderr[-3000:]
        )
    return json.loads(process.stdout.strip().splitlines()[-1])


def result_stem(config: Config) -> str:
    """``"gpu"``, or ``"gpu.tiny"`` for a tiny run, which measures nothing."""
    return "gpu.tiny" if config.tiny else "gpu"


def run(
    config: Config,
    counts: Sequence[int] | None,
    setups: Sequence[str],
    precisions: Sequence[str],
    out: Path,
    log=print,
) -> dict[str, Any]:
    """Measures every setup, device count and precision; writes ``gpu.json``
    and ``gpu.md`` (``gpu.tiny.*`` for a tiny run) to `out`.

    Raises:
        ValueError: If there is no GPU and `config` is not tiny, or `counts`
            asks for more devices than are visible.
    """
    started = time.perf_counter()
    probe = _call(config, "--probe")
    available = len(probe["devices"])
    if not config.tiny and available == 0:
        raise ValueError(
            "No GPU is visible. Run `python -m bench.gpu --tiny` to test the "
            "benchmark on logical CPUs. Received: 0 GPUs"
        )
    counts = list(counts or device_counts(available))
    if max(counts) > available or min(counts) < 1:
        raise ValueError(
            f"`--devices` must be between 1 and {available} (the visible "
            f"devices). Received: devices={counts}"
        )
    rows = []
    runs = [("plain", 1)] if "plain" in setups else []
    runs += [(s, n) for n in counts for s in setups if s != "plain"]
    for setup, devices in runs:
        log(f"[gpu] {setup} on {devices} device(s), {', '.join(precisions)}")
        try:
            found = _call(config, "--child", setup, str(devices), *precisions)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            # A crashed process (out of memory, a driver error) fails its
            # rows only.
            message = str(error).strip().splitlines()[-1][:300]
            failed = {"setup": setup, "devices": devices, "error": message}
            failed["global_batch"] = config.batch_per_device * devices
            found = [{**failed, "precision": p} for p in precisions]
        for row in found:
            measured = row.get("error") or f"{row['images_per_s']:.1f} images/s"
            log(f"[gpu]   {row['precision']}: {measured}")
        rows += found
    results = {
        "meta": {
            "command": " ".join(["python -m bench.gpu", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "config": dataclasses.asdict(config),
            "gpus": probe["gpus"],
            "machine": probe["machine"],
            "seconds": None,
            "notes": [
                "Global batch = batch_per_device x devices (weak scaling).",
                "scaling_efficiency = images_per_s / (devices x plain images_per_s)"
                " at the same precision.",
                "tiny runs use logical CPUs that share the machine's cores: they "
                "test the script, they do not measure scaling.",
            ],
        },
        "rows": add_scaling(rows),
    }
    results["meta"]["seconds"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    stem = result_stem(config)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown_table(results["rows"]))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Parses the command line, measures and prints the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu", description="images/s on 1..all GPUs"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="small model on logical CPUs (no GPU)"
    )
    parser.add_argument(
        "--model", choices=MODELS, help="default: resnet50 (tiny: tiny_resnet)"
    )
    parser.add_argument("--image-size", type=int, help="default: 224 (tiny: 32)")
    parser.add_argument("--classes", type=int, help="default: 1000 (tiny: 10)")
    parser.add_argument("--batch-per-device", type=int, help="default: 64 (tiny: 8)")
    parser.add_argument("--steps", type=int, help="timed steps (default: 30)")
    parser.add_argument("--warmup", type=int, help="untimed steps (default: 10)")
    parser.add_argument(
        "--devices", type=int, nargs="+", help="device counts (default: 1, 2, 4.. all)"
    )
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument(
        "--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS)
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.config:
        config = Config(**json.loads(args.config))
        if args.probe:
            _probe(config)
        else:
            setup, devices, *precisions = args.child
            _child(config, setup, int(devices), precisions)
        return
    config = TINY if args.tiny else Config()
    overrides = {
        "model": args.model,
        "image_size": args.image_size,
        "classes": args.classes,
        "batch_per_device": args.batch_per_device,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    config = dataclasses.replace(
        config, **{k: v for k, v in overrides.items() if v is not None}
    )
    try:
        results = run(
            config,
            args.devices,
            args.setups,
            args.precisions,
            args.out,
            log=lambda message: print(message, file=sys.stderr, flush=True),
        )
    except ValueError as error:
        parser.error(str(error))
    print(markdown_table(results["rows"]), end="")
    stem = args.out / result_stem(config)
    print(f"written to {stem}.json and {stem}.md")


if __name__ == "__main__":
    main()
