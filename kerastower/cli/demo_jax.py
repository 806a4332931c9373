"""The demo on Keras's JAX backend: digits on the towers' devices against
one device.

The same data and convnet as TensorFlow's demo (`kerastower.cli.digits`),
without `BatchNormalization`: Keras computes that layer in float32 on JAX
even under a float64 policy, so a float64 verdict could not see past float32
rounding there (tests/on_jax checks the layer against a yardstick). The
oracle is a plain `keras.Model` from the same initial weights on the same
batches (``shuffle=False``); the verdict is the float64 run's, the float32
run the user watches is reported beside its yardstick, one device fed each
batch's rows in reverse order.
"""

from __future__ import annotations

import time

from kerastower.cli.digits import convnet, load_digits


def _train(keras, tower_model, x, y, towers, dtype, seed, epochs, batch_size, verbose):
    """Plain, towers and the yardstick in `dtype`: their models and times."""
    from kerastower.on_jax import yardstick  # once `run` has set up JAX

    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    x = x.astype(dtype)

    def build(tower: bool):
        model = convnet(keras, seed)
        if tower:
            model = tower_model.from_model(model, towers=towers)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        return model

    fit = dict(batch_size=batch_size, epochs=epochs, shuffle=False)
    models, seconds = {}, {}
    for name, data in (
        ("towers", (x, y)),
        ("one_device", (x, y)),
        ("yardstick", yardstick.reversed_batches([x, y], batch_size)),
    ):
        models[name] = build(name == "towers")
        start = time.perf_counter()
        models[name].fit(*data, verbose=verbose if name == "towers" else 0, **fit)
        seconds[name] = time.perf_counter() - start
    return models, seconds


def run(
    towers: int | None,
    epochs: int = 3,
    batch_size: int = 32,
    seed: int = 0,
    tolerance: float = 1e-10,
    verbose: int = 1,
) -> int:
    """Trains the convnet on the towers and on one device, prints the report.

    Args:
        towers: The number of towers (devices of JAX's default backend), or
            ``None`` for all.
        epochs: Epochs of training. Defaults to 3.
        batch_size: The global batch size. Defaults to 32, which 1, 2, 4 and
            8 devices divide: those batches are sharded, the epoch's last
            (29 examples) runs whole on every device.
        seed: Seed of the data order and the initial weights. Defaults to 0.
        tolerance: The largest relative difference of the float64 run
            accepted as exact. Defaults to 1e-10.
        verbose: `fit`'s verbosity for the tower run. Defaults to 1.

    Returns:
        0 when the towers match one device in float64 within `tolerance`,
        else 1.
    """
    import jax

    jax.config.update("jax_enable_x64", True)  # for the float64 run
    import keras

    from kerastower.on_jax import TowerModel, yardstick
    from kerastower.on_jax.placement import device_name, resolve_devices

    (x, y), (x_test, y_test) = load_digits(seed)
    devices = [device_name(d) for d in resolve_devices(towers)]
    n = len(devices)
    print(
        f"kerastower demo on JAX: training on {n} devices ({', '.join(devices)}), "
        f"global batch {batch_size}",
        flush=True,
    )
    common = dict(towers=n, seed=seed, epochs=epochs, batch_size=batch_size)
    f32, seconds = _train(
        keras, TowerModel, x, y, dtype="float32", verbose=verbose, **common
    )
    print(
        "Trained the same model on one device, and all again in float64 ...", flush=True
    )
    f64, _ = _train(keras, TowerModel, x, y, dtype="float64", verbose=0, **common)
    difference64 = yardstick.weights_apart(f64["one_device"], f64["towers"])
    exact = difference64 <= tolerance
    difference32 = yardstick.weights_apart(f32["one_device"], f32["towers"])
    yardstick32 = yardstick.weights_apart(f32["one_device"], f32["yardstick"])
    test = {
        k: f32[k].evaluate(x_test.astype("float32"), y_test, verbose=0)[1] for k in f32
    }
    last = len(x) % batch_size
    platform = jax.devices()[0].platform.upper()
    towers_test, one_test = test["towers"], test["one_device"]
    layout = "sharded" if batch_size % n == 0 else "whole on every device"
    verdict = (
        "same model as one device"
        if exact
        else (f"DIFFERENT from one device (more than {tolerance:.0e})")
    )
    lines = [
        "",
        f"kerastower demo on JAX: a small convnet on scikit-learn's digits "
        f"({len(x)} training, {len(x_test)} test images, 8x8)",
        "",
        f"Towers        {n} x {platform}: {', '.join(devices)}",
        f"Batches       global batch {batch_size}: {layout}"
        + (f" ({batch_size // n} rows per device)" if layout == "sharded" else ""),
    ]
    if last:
        last_layout = "sharded" if last % n == 0 else "whole on every device"
        lines.append(f"              last batch of each epoch {last}: {last_layout}")
    lines += [
        f"Accuracy      test {towers_test:.3f} (one device: {one_test:.3f})",
        f"Time          towers {seconds['towers']:.2f} s, one device "
        f"{seconds['one_device']:.2f} s for {epochs} epochs (compilation included)",
        f"Exactness     float64: towers {difference64:.1e} from one device "
        f"(relative): {verdict}",
        f"              float32: towers {difference32:.1e} from one device; one "
        f"device fed each batch reordered: {yardstick32:.1e}",
        "",
    ]
    print("\n".join(lines), flush=True)
    return 0 if exact else 1
