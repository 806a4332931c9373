"""``python -m bench.jax_gpu``: `TowerModel` on Keras's JAX backend against a
plain `keras.Model` on one GPU.

Made for a machine that has JAX with CUDA and nothing else (no TensorFlow,
no network): Keras and its two missing dependencies travel as wheels, and
kerastower as its source tree. It never imports TensorFlow. Two parts:

- **exactness**: a small convnet with `BatchNormalization` and a masked
  sequence branch, in float64, trained with Adam by a plain `keras.Model`
  and by a `TowerModel` over every GPU from the same initial weights, on a
  global batch of 27 (its last batch 19): the largest weight difference,
  relative to the largest weight, and the largest history difference;
- **speed**: ``keras.applications.ResNet50(weights=None)`` on 224x224x3
  ``uint8`` images (rescaled inside the model), batch 128, SGD with momentum,
  ``jit_compile=True``, in ``float32`` and ``mixed_bfloat16``, each setup in
  its own process: the first ``fit`` of one step (compilation included), and
  the step time, the best of three ``fit`` calls of ``--steps`` steps each,
  every call ending when the new weights are on the host.

Results go to ``jax_gpu.json`` and ``jax_gpu.md`` in ``--out``. On the device
machine (see ``bench/README.md`` for the wheels)::

    python -m bench.jax_gpu --out $OUT

``--tiny`` runs the same code on this machine's CPUs with a small model, as a
test that the script works (not a measurement).
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
SETUPS = ("plain", "tower")
PRECISIONS = ("float32", "mixed_bfloat16")


def _build(setup: str, image: int, classes: int, tiny: bool):
    import keras

    import kerastower

    inputs = keras.Input((image, image, 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 127.5, offset=-1)(inputs)
    if tiny:
        x = keras.layers.Conv2D(8, 3, activation="relu")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        outputs = keras.layers.Dense(classes)(x)
    else:
        net = keras.applications.ResNet50(
            weights=None,
            input_shape=(image, image, 3),
            classes=classes,
            classifier_activation=None,
        )
        outputs = net(x)
    if setup == "plain":
        return keras.Model(inputs, outputs)
    return kerastower.TowerModel(inputs, outputs)


def _synced(model) -> None:
    """Waits for the queued work: the new weights, read on the host."""
    float(model.trainable_variables[-1].numpy().ravel()[0])


def speed(setup: str, precision: str, args) -> dict:
    """One setup's time to the first step and its step time, in this process."""
    import keras
    import numpy as np

    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    model = _build(setup, args.image_size, args.classes, args.tiny)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (args.batch, args.image_size, args.image_size, 3), "uint8")
    y = rng.integers(0, args.classes, (args.batch,))

    def batches():
        while True:
            yield x, y

    start = time.perf_counter()
    model.fit(batches(), steps_per_epoch=1, epochs=1, verbose=0)
    _synced(model)
    first = time.perf_counter() - start
    steps = []
    for _ in range(3):
        start = time.perf_counter()
        model.fit(batches(), steps_per_epoch=args.steps, epochs=1, verbose=0)
        _synced(model)
        steps.append((time.perf_counter() - start) / args.steps)
    step = min(steps)
    return {
        "setup": setup,
        "precision": precision,
        "towers": getattr(model, "num_towers", 1),
        "first_fit_s": round(first, 2),
        "step_ms": round(step * 1000, 2),
        "images_per_s": round(args.batch / step, 1),
        "step_ms_all": [round(s * 1000, 2) for s in steps],
    }


def exactness() -> dict:
    """A plain model and a `TowerModel` over every device, float64, Adam.

    Two models: a sequence model (masked embedding, GRU), all in float64, and
    a convnet with `BatchNormalization`, which Keras computes in float32 on
    JAX whatever the policy (its ``result_type(float64, float32)`` is float32
    on every backend but TensorFlow), measured against a yardstick: the plain
    model fed each batch's rows in reverse order.
    """
    import jax

    jax.config.update("jax_enable_x64", True)  # before Keras makes a variable
    import keras
    import numpy as np

    import kerastower
    from kerastower.on_jax import yardstick

    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")

    def build(kind: str, tower: bool):
        keras.utils.set_random_seed(1)
        if kind == "sequence":
            inputs = keras.Input((6,), dtype="int32")
            h = keras.layers.Embedding(20, 4, mask_zero=True)(inputs)
            h = keras.layers.GRU(4)(h)
        else:
            inputs = keras.Input((8, 8, 1))
            h = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
            h = keras.layers.BatchNormalization()(h)
            h = keras.layers.GlobalMaxPooling2D()(h)
        outputs = keras.layers.Dense(3)(h)
        model = (kerastower.TowerModel if tower else keras.Model)(inputs, outputs)
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    rng = np.random.default_rng(0)
    n = 100
    data = {
        "sequence": rng.integers(1, 20, (n, 6)).astype("int32"),
        "batchnorm": rng.normal(size=(n, 8, 8, 1)),
    }
    data["sequence"][:, 4:] = 0
    y = rng.integers(0, 3, (n,))
    results = {}
    for kind, x in data.items():
        for batch in (20, 27):  # every batch sharded on 4 towers; none
            runs = []
            for tower, (xs, ys) in [
                (False, (x, y)),
                (True, (x, y)),
                (False, yardstick.reversed_batches([x, y], batch)),
            ]:
                model = build(kind, tower)
                fit = model.fit(
                    xs, ys, batch_size=batch, epochs=3, shuffle=False, verbose=0
                )
                runs.append((model, fit.history))
            (plain, plain_fit), (tower, tower_fit), (yard, yard_fit) = runs

            results[f"{kind}, batch {batch}"] = {
                "towers": tower.num_towers,
                "weights_relative": yardstick.weights_apart(plain, tower),
                "yardstick_relative": yardstick.weights_apart(plain, yard),
                "history": max(
                    abs(a - b)
                    for key in plain_fit
                    for a, b in zip(plain_fit[key], tower_fit[key], strict=True)
                ),
                "predictions": float(
                    np.max(
                        np.abs(
                            plain.predict(x, batch_size=batch, verbose=0)
                            - tower.predict(x, batch_size=batch, verbose=0)
                        )
                    )
                ),
            }
    return results


def _environment() -> dict:
    import jax
    import keras

    device = jax.devices()[0]
    return {
        "device": getattr(device, "device_kind", device.platform),
        "devices": jax.device_count(),
        "jax": jax.__version__,
        "keras": keras.__version__,
    }


def _child(part: str, args) -> dict:
    command = [sys.executable, "-m", "bench.jax_gpu", "--part", part, *args.passed]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"part": part, "error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(results: dict) -> str:
    env = results["environment"]
    lines = [
        f"TowerModel on JAX against a plain keras.Model ({env['device']}, "
        f"{env['devices']} device(s), jax {env['jax']}, Keras {env['keras']})",
        "",
        "| precision | setup | towers | first fit (s) | step (ms) | images/s "
        "| step vs plain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    plain = {r["precision"]: r for r in results["speed"] if r.get("setup") == "plain"}
    for r in results["speed"]:
        if "error" in r:
            lines.append(f"| {r['part']} | error | | | | | |")
            continue
        ratio = r["step_ms"] / plain[r["precision"]]["step_ms"]
        lines.append(
            f"| {r['precision']} | {r['setup']} | {r['towers']} | {r['first_fit_s']} "
            f"| {r['step_ms']} | {r['images_per_s']} | {ratio:.3f} |"
        )
    lines += [
        "",
        "| exactness (float64, Adam) | towers | weights | yardstick "
        "| history | predictions |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, e in results["exactness"].items():
        if kind == "error" or not isinstance(e, dict):
            lines.append(f"| error | {str(e)[-200:]!r} | | | | |")
            continue
        lines.append(
            f"| {kind} | {e['towers']} | {e['weights_relative']:.1e} "
            f"| {e['yardstick_relative']:.1e} | {e['history']:.1e} "
            f"| {e['predictions']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jax_gpu")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.passed = ["--tiny"] if args.tiny else []
    args.passed += ["--steps", str(args.steps)]
    args.image_size, args.batch, args.classes = (
        (16, 8, 10) if args.tiny else (224, 128, 1000)
    )
    os.environ["KERAS_BACKEND"] = "jax"
    if args.part == "exactness":
        print(json.dumps(exactness()))
        return
    if args.part is not None:
        setup, precision = args.part.split(":")
        print(json.dumps(speed(setup, precision, args)))
        return
    results = {
        "environment": json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import json, bench.jax_gpu as b; "
                    "print(json.dumps(b._environment()))",
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        ),
        "exactness": _child("exactness", args),
        "speed": [_child(f"{s}:{p}", args) for p in PRECISIONS for s in SETUPS],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "jax_gpu.tiny" if args.tiny else "jax_gpu"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(_table(results))
    print(_table(results))


if __name__ == "__main__":
    main()
