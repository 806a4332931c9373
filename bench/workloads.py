"""The models, data and training variants the benchmarks time.

A *variant* is one way of training the same model on the same data: a plain
`keras.Model` on one device, a `kerastower.TowerModel` over ``N`` towers, or
the model built under stock `tf.distribute.MirroredStrategy` on the same ``N``
logical devices. Batch sizes here are **global** (all towers or replicas
together); every benchmark batch size divides by 2 and 4 so that stock
`MirroredStrategy` gets even shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

import kerastower

KINDS = ("plain", "tower", "tower_replicas", "mirrored", "mirrored_collective")


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model builder with its data.

    Attributes:
        name: Short name used in results (``"mlp"``, ``"convnet"``).
        build: Returns a fresh, uncompiled functional `keras.Model`; the same
            seed every call, so every variant starts from the same weights.
        input_shape: Shape of one example.
        batch_size: The global batch size of every timed step.
        description: One line for the report.
    """

    name: str
    build: Callable[[], keras.Model]
    input_shape: tuple[int, ...]
    batch_size: int
    description: str

    def data(self, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Returns ``steps`` global batches of random inputs and class labels."""
        rng = np.random.default_rng(seed)
        n = steps * self.batch_size
        x = rng.normal(size=(n, *self.input_shape)).astype("float32")
        y = rng.integers(0, 10, size=(n,)).astype("int32")
        return x, y


def _mlp(inputs: int = 64, hidden: int = 256) -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((inputs,))
    h = keras.layers.Dense(hidden, activation="relu")(x)
    h = keras.layers.Dense(hidden, activation="relu")(h)
    return keras.Model(x, keras.layers.Dense(10)(h), name="mlp")


def _convnet() -> keras.Model:
    keras.utils.set_random_seed(0)
    x = keras.Input((28, 28, 1))
    h = keras.layers.Conv2D(16, 3, activation="relu")(x)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, activation="relu")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(x, keras.layers.Dense(10)(h), name="convnet")


def _tiny_mlp() -> keras.Model:
    return _mlp(inputs=16, hidden=32)


WORKLOADS = {
    "mlp": Workload(
        "mlp",
        _mlp,
        (64,),
        128,
        "MLP 64-256-256-10 (ReLU), softmax cross-entropy, global batch 128",
    ),
    "convnet": Workload(
        "convnet",
        _convnet,
        (28, 28, 1),
        64,
        "Conv(16,3x3)-MaxPool-Conv(32,3x3)-GAP-Dense(10) on 28x28x1, global batch 64",
    ),
    "tiny_mlp": Workload(
        "tiny_mlp",
        _tiny_mlp,
        (16,),
        32,
        "MLP 16-32-32-10 (smoke runs only), global batch 32",
    ),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way of training a workload.

    Attributes:
        kind: ``"plain"`` (a `keras.Model`, one device), ``"tower"``
            (`kerastower.TowerModel`), ``"tower_replicas"`` (the same with
            ``replicate_variables=True``), ``"mirrored"`` (stock Keras under
            `MirroredStrategy` with `ReductionToOneDevice`) or
            ``"mirrored_collective"`` (stock `MirroredStrategy` with its default
            cross-device ops, collective all-reduce).
        devices: Towers or replicas; 1 for ``"plain"``.
        jit_compile: Passed to `compile`.
        steps_per_execution: Passed to `compile`.
    """

    kind: str
    devices: int = 1
    jit_compile: bool = False
    steps_per_execution: int = 1

    @property
    def name(self) -> str:
        if self.kind == "plain":
            return "plain"
        short = {
            "tower": "tower",
            "tower_replicas": "tower_replicas",
            "mirrored": "mirrored",
        }.get(self.kind, "mirrored_coll")
        return f"{short}{self.devices}"


def cpu_devices(n: int) -> list[str]:
    """The first ``n`` logical CPUs."""
    return [d.name for d in tf.config.list_logical_devices("CPU")[:n]]


def mirrored_strategy(n: int, collective: bool = False) -> tf.distribute.Strategy:
    """Stock `MirroredStrategy` on the first ``n`` logical CPUs.

    Its default cross-device ops on CPUs is a collective all-reduce whose group
    keys clash between several strategies in one process ("joining a group
    with size 4, but that group has size 2"), so the main baseline passes
    `ReductionToOneDevice` (a stock option, and the faster one on CPUs). For
    the collective variant the key base is moved, as TensorFlow's own strategy
    tests do, so that strategies do not share group keys.
    """
    if collective:
        tf.distribute.MirroredStrategy._collective_key_base += 100_000
        return tf.distribute.MirroredStrategy(devices=cpu_devices(n))
    return tf.distribute.MirroredStrategy(
        devices=cpu_devices(n),
        cross_device_ops=tf.distribute.ReductionToOneDevice(),
    )


def build_variant(workload: Workload, variant: Variant) -> keras.Model:
    """Builds and compiles `workload`'s model the way `variant` says."""

    def compile_model(model: keras.Model) -> keras.Model:
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=variant.jit_compile,
            steps_per_execution=variant.steps_per_execution,
        )
        return model

    if variant.kind == "plain":
        return compile_model(workload.build())
    if variant.kind in ("tower", "tower_replicas"):
        model = kerastower.TowerModel.from_model(
            workload.build(),
            towers=variant.devices,
            replicate_variables=variant.kind == "tower_replicas",
        )
        return compile_model(model)
    if variant.kind in ("mirrored", "mirrored_collective"):
        strategy = mirrored_strategy(
            variant.devices, collective=variant.kind == "mirrored_collective"
        )
        with strategy.scope():
            return compile_model(workload.build())
    raise ValueError(f"`kind` must be one of {KINDS}. Received: kind={variant.kind!r}")


def describe_error(error: Exception) -> str:
    """One line for the results: the error type and its telling lines.

    TensorFlow's runtime errors start with "Graph execution error:" and a
    Python stack; the cause ("Trying to access resource ... located in device
    CPU:1 from device CPU:0") comes after it.
    """
    skip = ("File ", "Detected at node", "[[", "Cf. ", "Graph execution error")
    lines = [line.strip() for line in str(error).splitlines()]
    telling = [line for line in lines if line and not line.startswith(skip)]
    return f"{type(error).__name__}: {' '.join(telling[-1:] or lines[:1])[:300]}"
