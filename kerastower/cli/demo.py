"""The demo behind ``kerastower demo``: digits on towers against one device.

The oracle is the same convnet, from the same initial weights, trained as a
plain `keras.Model` on one device on the same batches in the same order
(``shuffle=False`` on data shuffled once with the seed), by
`kerastower.testing.compare_with_one_device`. The verdict comes from a
float64 run, where the towers agree with one device to rounding on any
machine; the float32 run that the user watches is reported beside its
yardstick, one device against itself on the same batches reordered, since
float32 rounding after many Adam steps depends on the machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.callbacks.tower_monitor import TowerMonitor
from kerastower.cli.digits import convnet, load_digits
from kerastower.model import TowerModel
from kerastower.step.shards import split_sizes
from kerastower.testing import Comparison, compare_with_one_device

__all__ = ["DemoResult", "build_convnet", "format_report", "load_digits", "run"]


# Keras 2's `BatchNormalization` takes `fused`; Keras 3's has no fused kernel.
_UNFUSED = _keras_compat.unfused_batch_norm()


def build_convnet(seed: int = 0) -> keras.Model:
    """Returns the demo's small convnet for 8x8 digits, seeded.

    Two 3x3 convolutions (the first followed by `BatchNormalization`, which
    `TowerModel` synchronises over the towers), average pooling and two
    dense layers: about 40,000 weights. Average, not max, pooling: max
    pooling sends a window's gradient to its largest value, and where two
    values are within float32 rounding of each other the towers' rounding
    (as any other order of summing the batch) can pick the other one, a
    jump that training then carries on (see "What exact means in float32"
    in the docs' Concepts). On Keras 2 the layer is unfused, as it runs on
    towers: Keras 2's fused kernel rounds otherwise, and one device with and
    without it differs by 2.5e-3 after the demo's epoch of Adam (Keras 2 in
    the docs' Installation page).

    Args:
        seed: Seed of the initial weights. Defaults to 0.

    Returns:
        A plain functional `keras.Model`, not compiled.
    """
    return convnet(keras, seed, batch_norm=_UNFUSED)


def _compile(model: keras.Model) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )


def _builder(seed: int):
    """``build(towers)``: the convnet, a `TowerModel` unless ``towers == 1``."""

    def build(towers):
        model = build_convnet(seed)
        if towers != 1:
            model = TowerModel.from_model(model, towers=towers)
        _compile(model)
        return model

    return build


@dataclass
class DemoResult:
    """What the demo measured, for the report.

    `float32` is the run the user watched, `float64` the same model and
    batches in float64, whose verdict is the demo's.
    """

    devices: list[str]
    train_examples: int
    test_examples: int
    batch_size: int
    epoch_seconds: list[float]
    one_device_seconds: float
    tower_examples: list[int]
    train_accuracy: float
    test_accuracy: float
    one_device_test_accuracy: float
    float32: Comparison
    float64: Comparison
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.float64.same


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) + " s"


def format_report(result: DemoResult) -> str:
    """Returns the demo's report as text."""
    towers = len(result.devices)
    gpus = all("GPU" in d.upper() for d in result.devices)
    kind = "GPU" if gpus else "logical CPU"
    batch = result.batch_size
    last = result.train_examples % batch
    lines = [
        "",
        "kerastower demo: a small convnet on scikit-learn's digits "
        f"({result.train_examples} training, {result.test_examples} test images, "
        "8x8)",
        "",
        f"Towers        {towers} x {kind}: {', '.join(result.devices)}",
        f"Batches       global batch {batch} -> per tower {split_sizes(batch, towers)}",
    ]
    if last:
        lines.append(
            f"              last batch of each epoch {last} -> per tower "
            f"{split_sizes(last, towers)}"
        )
    lines += [
        f"              examples per tower per epoch: {result.tower_examples}",
        f"Accuracy      train {result.train_accuracy:.3f}, test "
        f"{result.test_accuracy:.3f} (one device: test "
        f"{result.one_device_test_accuracy:.3f})",
        f"Time          towers: {_seconds(result.epoch_seconds)} per epoch (the "
        "first includes tracing)",
        f"              one device: {result.one_device_seconds:.2f} s for all epochs",
    ]
    if not gpus:
        lines.append(
            "              (logical CPUs share the same cores: they show the "
            "splitting, not a speed-up)"
        )
    f32, f64 = result.float32, result.float64
    verdict = (
        "same model as one device"
        if result.exact
        else f"DIFFERENT from one device (more than {f64.bound:.0e})"
    )
    lines += [
        f"Exactness     float64: towers {f64.difference:.1e} from one device "
        f"(relative): {verdict}",
        f"              float32: towers {f32.difference:.1e} from one device; one "
        f"device fed each batch reordered: {f32.yardstick:.1e}",
        "              (float32 rounding depends on the order of each sum and grows "
        "with Adam steps,",
        "              on one device too; float64 shows what the towers compute)",
        *result.notes,
        "",
    ]
    return "\n".join(lines)


def run(
    devices: list[str],
    epochs: int = 3,
    batch_size: int = 30,
    seed: int = 0,
    log_dir: str | None = None,
    tolerance: float = 1e-10,
    verbose: int = 1,
) -> int:
    """Trains the convnet on `devices` and on one device, prints the report.

    Args:
        devices: The tower devices, already configured.
        epochs: Epochs of training. Defaults to 3.
        batch_size: The global batch size (all towers together). Defaults to
            30.
        seed: Seed of the data order and the initial weights. Defaults to 0.
        log_dir: Where `TowerMonitor` writes TensorBoard logs, or ``None``.
            Defaults to ``None``.
        tolerance: The largest relative difference of the float64 run
            accepted as exact. Defaults to 1e-10.
        verbose: `fit`'s verbosity for the tower run. Defaults to 1.

    Returns:
        0 when the towers match one device in float64 within `tolerance`,
        else 1.
    """
    (x, y), (x_test, y_test) = load_digits(seed)
    build = _builder(seed)
    print(
        f"kerastower demo: training on {len(devices)} towers "
        f"({', '.join(devices)}), global batch "
        f"{batch_size} -> per tower {split_sizes(batch_size, len(devices))}",
        flush=True,
    )
    monitor = TowerMonitor(log_dir)
    common = dict(towers=devices, batch_size=batch_size, epochs=epochs, seed=seed)
    float32 = compare_with_one_device(
        build, x, y, dtype="float32", callbacks=[monitor], verbose=verbose, **common
    )
    print(
        "Trained the same model on one device, and both again in float64 ...",
        flush=True,
    )
    float64 = compare_with_one_device(
        build, x, y, dtype="float64", yardstick=False, tolerance=tolerance, **common
    )
    model, plain = float32.tower_model, float32.one_device_model
    train_accuracy = model.evaluate(x, y, batch_size=256, verbose=0)[1]
    test_accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)[1]
    plain_test = plain.evaluate(x_test, y_test, batch_size=256, verbose=0)[1]
    notes = []
    if log_dir:
        notes.append(f"TensorBoard   tensorboard --logdir {log_dir}")
    result = DemoResult(
        devices=list(devices),
        train_examples=len(x),
        test_examples=len(x_test),
        batch_size=batch_size,
        epoch_seconds=[r["seconds"] for r in monitor.history],
        one_device_seconds=float32.seconds["one_device"],
        tower_examples=monitor.history[-1]["tower_examples"],
        train_accuracy=float(train_accuracy),
        test_accuracy=float(test_accuracy),
        one_device_test_accuracy=float(plain_test),
        float32=float32,
        float64=float64,
        notes=notes,
    )
    print(format_report(result), flush=True)
    return 0 if result.exact else 1
