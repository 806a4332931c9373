"""`compare_with_one_device`: a model's towers against one device, and its report."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kerastower._keras_compat.family import keras
from kerastower._keras_compat.precision import float_dtype
from kerastower.callbacks.gradient_accumulation import GradientAccumulation
from kerastower.model import TowerModel
from kerastower.testing.differences import relative_difference, reorder_batches

# Differences within this many yardsticks are rounding (`Comparison.same`).
YARDSTICK_FACTOR = 10.0
DEFAULT_TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


@dataclasses.dataclass
class Comparison:
    """What `compare_with_one_device` measured.

    Every difference is relative: ``max |towers - one device|`` over a
    weight, a history key's values or the predictions, divided by one
    device's largest weight (of any tensor), largest value of that key, or
    largest prediction; the largest of them.

    Args:
        dtype: The float dtype both runs trained in.
        towers: The towers' devices.
        steps: The optimizer steps each run took.
        weights: The largest relative difference of a weight tensor.
        worst_weight: The path of that weight.
        weights_absolute: ``max |w_towers - w_one_device|`` over all weights.
        history: The largest relative difference of a value in one device's
            `fit` history (keys that the tower run's `callbacks` add are not
            compared).
        predictions: The relative difference of `predict`'s outputs on `x`.
        yardstick: The largest of the three for one device against itself
            on reordered batches, or ``None`` when not measured.
        tolerance: The difference that counts as rounding without a
            yardstick.
        seconds: The seconds of each `fit`: ``"towers"``, ``"one_device"``
            and maybe ``"yardstick"``.
        tower_model: The trained tower model.
        one_device_model: The trained one-device model.
    """

    dtype: str
    towers: list[str]
    steps: int
    weights: float
    worst_weight: str
    weights_absolute: float
    history: float
    predictions: float
    yardstick: float | None
    tolerance: float
    seconds: dict[str, float]
    tower_model: keras.Model = dataclasses.field(repr=False)
    one_device_model: keras.Model = dataclasses.field(repr=False)

    @property
    def difference(self) -> float:
        """The largest of the weights', history's and predictions' differences."""
        return max(self.weights, self.history, self.predictions)

    @property
    def bound(self) -> float:
        """The largest difference that is rounding: in float64 the
        tolerance; in float32 the tolerance or `YARDSTICK_FACTOR` yardsticks,
        whichever is more."""
        if self.dtype == "float64" or self.yardstick is None:
            return self.tolerance
        return max(self.tolerance, YARDSTICK_FACTOR * self.yardstick)

    @property
    def same(self) -> bool:
        """Whether the towers trained one device's model (NaN: no)."""
        return self.difference <= self.bound

    def __str__(self) -> str:
        verdict = (
            "same as one device"
            if self.same
            else f"DIFFERENT from one device (more than {self.bound:.1e})"
        )
        lines = [
            f"Towers against one device, {self.dtype}, {len(self.towers)} towers, "
            f"{self.steps} steps: {verdict}",
            f"  weights      {self.weights:.1e} relative ({self.weights_absolute:.1e} "
            f"absolute), worst: {self.worst_weight}",
            f"  history      {self.history:.1e} relative",
            f"  predictions  {self.predictions:.1e} relative",
        ]
        if self.yardstick is not None:
            lines.append(
                f"  yardstick    {self.yardstick:.1e}: one device against itself, "
                "each batch's examples in another order"
            )
        return "\n".join(lines)


def compare_with_one_device(
    build_model: Callable[[Any], keras.Model],
    x: Any,
    y: Any = None,
    *,
    towers: int | Sequence[str] | None = None,
    batch_size: int = 32,
    epochs: int = 1,
    sample_weight: Any = None,
    dtype: str = "float64",
    yardstick: bool = True,
    accumulation_steps: int | None = None,
    tolerance: float | None = None,
    seed: int = 0,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    verbose: int = 0,
) -> Comparison:
    """Trains a model on towers and on one device, and compares the two.

    ``build_model(towers)`` is called once with `towers` and once with ``1``
    (the one-device model), each time after ``keras.utils.set_random_seed(
    seed)`` and inside `float_dtype(dtype)`; it returns a compiled model,
    a `TowerModel` for `towers`. Both train with ``fit(x, y, batch_size,
    epochs, shuffle=False)`` on the same batches (the one-device model from
    the tower model's initial weights), then the two are compared: every
    weight, every value of the `fit` history, and `predict` on `x`.

    Float inputs, targets and sample weights are cast to `dtype`. With
    `yardstick`, a third model trains on one device on the same batches with
    each batch's examples in another order (`reorder_batches`): how far one
    device is from itself. The verdict, `Comparison.same`, accepts
    differences up to `tolerance`, in float32 up to 10 yardsticks where that
    is more: float64 rounding stays far below any real difference, float32
    rounding after many steps is the machine's.

    Example:

    ```python
    import keras
    import numpy as np

    import kerastower
    from kerastower.testing import compare_with_one_device

    kerastower.configure_logical_devices(3)  # without GPUs: 3 logical CPUs


    def build(towers):
        inputs = keras.Input((4,))
        outputs = keras.layers.Dense(1)(keras.layers.Dense(8, "relu")(inputs))
        model = kerastower.TowerModel(inputs, outputs, towers=towers)
        model.compile(optimizer="adam", loss="mse")
        return model


    x = np.random.default_rng(0).normal(size=(50, 4))
    y = x.sum(axis=1, keepdims=True)
    report = compare_with_one_device(build, x, y, towers=3, batch_size=16)
    print(report)  # global batches 16, 16, 16 and 2: 6 + 5 + 5 examples, ...
    assert report.same
    ```

    Args:
        build_model: A callable taking `towers` (as `TowerModel` takes it, or
            ``1``) and returning a new compiled model: a `TowerModel` (or a
            subclass) for `towers`, any `keras.Model` for ``1``.
        x: The inputs: an array, or a list or dict of arrays.
        y: The targets, as `x`, or ``None`` for a model whose loss needs
            none. Defaults to ``None``.
        towers: The towers of the tower run. Defaults to ``None``: every GPU,
            else every logical CPU.
        batch_size: The **global** batch size (all towers together), or with
            `accumulation_steps` the global micro-batch size. Defaults to 32.
        epochs: Epochs of each run. Defaults to 1.
        sample_weight: Per-example weights, as `fit` takes them, or ``None``.
            Defaults to ``None``.
        dtype: ``"float64"`` for a verdict that holds on any machine, or
            ``"float32"``, to be read against the yardstick. Defaults to
            ``"float64"``.
        yardstick: Whether to measure one device against itself. Defaults to
            ``True``.
        accumulation_steps: Micro-batches per update: the towers train with
            `kerastower.callbacks.GradientAccumulation` on batches of
            `batch_size`, one device on batches of ``accumulation_steps *
            batch_size``. Defaults to ``None``: no accumulation.
        tolerance: The relative difference accepted as rounding (in
            float32, at least 10 yardsticks). Defaults to ``1e-10`` in float64
            and ``1e-5`` in float32.
        seed: The seed set before each build. Defaults to 0.
        callbacks: More callbacks for the tower run's `fit`. Defaults to none.
        verbose: `fit`'s verbosity for the tower run. Defaults to 0.

    Returns:
        A `Comparison`; ``str()`` of it is a short report.

    Raises:
        ValueError: If `dtype` is not ``"float64"`` or ``"float32"``, or
            `batch_size`, `epochs` or `accumulation_steps` is not a positive
            integer, or `build_model` does not return a compiled model (a
            `TowerModel` for `towers`).
    """
    if dtype not in DEFAULT_TOLERANCE:
        raise ValueError(
            f"`dtype` must be 'float64' or 'float32'. Received: dtype={dtype!r}"
        )
    for name, value in (("batch_size", batch_size), ("epochs", epochs)):
        _check_positive(name, value)
    if accumulation_steps is not None:
        _check_positive("accumulation_steps", accumulation_steps)
    with float_dtype(dtype):
        x, y, sample_weight = _cast((x, y, sample_weight), dtype)
        data = dict(x=x, y=y, sample_weight=sample_weight, epochs=epochs, shuffle=False)
        one_batch = batch_size * (accumulation_steps or 1)
        tower_model = _build(build_model, towers, seed, x, TowerModel)
        initial = tower_model.get_weights()
        one_device = _build(build_model, 1, seed, x, keras.Model, initial)
        device = tf.device(tower_model.tower_devices[0])
        if accumulation_steps is not None:
            callbacks = [*callbacks, GradientAccumulation(accumulation_steps)]
        runs = {
            "towers": _fit(
                tower_model,
                data,
                batch_size=batch_size,
                callbacks=list(callbacks),
                verbose=verbose,
            ),
        }
        with device:
            runs["one_device"] = _fit(one_device, data, batch_size=one_batch)
        weights, worst, absolute = _weight_differences(tower_model, one_device)
        differences = (
            weights,
            _history_difference(runs["towers"][0], runs["one_device"][0]),
            _prediction_difference(tower_model, one_device, x, batch_size, device),
        )
        measured = None
        if yardstick:
            reordered = _build(build_model, 1, seed, x, keras.Model, initial)
            with device:
                data |= reorder_batches(
                    {k: data[k] for k in ("x", "y", "sample_weight")}, one_batch
                )
                runs["yardstick"] = _fit(reordered, data, batch_size=one_batch)
            measured = max(
                _weight_differences(reordered, one_device)[0],
                _history_difference(runs["yardstick"][0], runs["one_device"][0]),
                _prediction_difference(reordered, one_device, x, batch_size, device),
            )
    return Comparison(
        dtype=dtype,
        towers=tower_model.tower_devices,
        steps=epochs * math.ceil(len(tf.nest.flatten(x)[0]) / one_batch),
        weights=weights,
        worst_weight=worst,
        weights_absolute=absolute,
        history=differences[1],
        predictions=differences[2],
        yardstick=measured,
        tolerance=DEFAULT_TOLERANCE[dtype] if tolerance is None else tolerance,
        seconds={name: seconds for name, (_, seconds) in runs.items()},
        tower_model=tower_model,
        one_device_model=one_device,
    )


def _fit(model: keras.Model, data: dict, **kwargs: Any) -> tuple[dict, float]:
    """``model.fit(**data, **kwargs)``: its history and its seconds."""
    kwargs.setdefault("verbose", 0)
    start = time.perf_counter()
    history = model.fit(**data, **kwargs).history
    return history, time.perf_counter() - start


def _check_positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"`{name}` must be an integer of at least 1. Received: {name}={value!r}"
        )


def _cast(data: Any, dtype: str) -> Any:
    """Float arrays of the nest `data` cast to `dtype`; others as they are."""

    def cast(leaf):
        if leaf is None:
            return None
        array = np.asarray(leaf)
        return array.astype(dtype) if array.dtype.kind == "f" else array

    return tf.nest.map_structure(cast, data)


def _build(build_model, towers, seed, x, expected: type, weights=None):
    """``build_model(towers)`` after seeding, built on one example, with
    `weights` if given."""
    keras.utils.set_random_seed(seed)
    model = build_model(towers)
    if not isinstance(model, expected) or not _compiled(model):
        received = type(model).__name__
        if isinstance(model, keras.Model) and not _compiled(model):
            received += ", not compiled"
        raise ValueError(
            f"`build_model({towers!r})` must return a compiled "
            f"{expected.__name__}. Received: {received}"
        )
    if not model.built:
        model(tf.nest.map_structure(lambda a: a[:1], x), training=False)
    if weights is not None:
        model.set_weights(weights)
    return model


def _weight_differences(a: keras.Model, b: keras.Model) -> tuple[float, str, float]:
    """The largest difference of a weight relative to `b`'s largest weight,
    that weight's path, and the largest absolute difference.

    One scale for the whole model: a weight that stays near zero (a bias
    without gradient, which Adam moves by rounding) measured against its
    own size would turn rounding into a large relative difference.
    """
    pairs = [
        (np.asarray(u.numpy()), np.asarray(v.numpy()), v)
        for u, v in zip(a.weights, b.weights, strict=True)
    ]
    scale = max((float(np.max(np.abs(e))) for _, e, _ in pairs if e.size), default=0.0)
    worst, path, absolute = 0.0, "-", 0.0
    for actual, expected, variable in pairs:
        relative = relative_difference(actual, expected, scale)
        if not relative <= worst:  # NaN too
            worst = relative
            path = getattr(variable, "path", None) or variable.name
    absolute = worst * scale if math.isfinite(worst) else worst
    return worst, path, absolute


def _history_difference(actual: dict, expected: dict) -> float:
    """The largest relative difference of a value one device's history
    holds; ``inf`` when the towers' lacks a key (callbacks of the tower run
    may add keys of their own)."""
    if not set(expected) <= set(actual):
        return math.inf
    return max(
        (relative_difference(actual[k], expected[k]) for k in expected), default=0.0
    )


def _prediction_difference(a, b, x, batch_size, device) -> float:
    """The relative difference of two models' predictions on `x`."""
    actual = a.predict(x, batch_size=batch_size, verbose=0)
    with device:
        expected = b.predict(x, batch_size=batch_size, verbose=0)
    return max(
        (
            relative_difference(u, v)
            for u, v in zip(
                tf.nest.flatten(actual), tf.nest.flatten(expected), strict=True
            )
        ),
        default=0.0,
    )


def _compiled(model: keras.Model) -> bool:
    """Whether `model` was compiled (Keras 3 sets the optimizer in `compile`
    only)."""
    return getattr(model, "optimizer", None) is not None
