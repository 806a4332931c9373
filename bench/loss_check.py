"""``python -m bench.loss_check``: the cost of the first step's loss check.

A `TowerModel`'s first training step tries its compiled loss on the whole
batch and on the towers' shards (`kerastower.step.coupled_loss`); later
steps read one boolean and let the gradients wait for it. This times the
first `fit` (tracing included) and the steady step of the same model, a
Dense 32-64-64-1 regressor with ``mse`` on 4 logical CPUs, with the check
and with it switched off, interleaved in one process:

- ``checked``: `TowerModel(towers=4)` as users get it;
- ``unchecked``: the same, traced while `CoupledLossCheck.applies` answers
  no (the switch exists for this measurement only).

``checked / unchecked`` of the steady step is what a separable loss pays
after the first step: 1 within noise is the target. Logical CPUs share the
machine's cores: a ratio, not a speed.
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import sys
import time
from typing import Any

from bench.timing import interleaved_main

FEATURES, WIDTH = 32, 64


@contextlib.contextmanager
def _check(on: bool):
    from kerastower.step.coupled_loss import CoupledLossCheck

    applies = CoupledLossCheck.applies
    if not on:
        CoupledLossCheck.applies = lambda self: False
    try:
        yield
    finally:
        CoupledLossCheck.applies = applies


def _build():
    import keras

    import kerastower

    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(WIDTH, activation="relu")(inputs)
    h = keras.layers.Dense(WIDTH, activation="relu")(h)
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(h), towers=4)
    model.compile(optimizer="adam", loss="mse")
    return model


def run(batch: int, steps: int, repeats: int, log=print) -> dict[str, Any]:
    """Times the first `fit` and ``steps`` steady steps per variant, ``repeats``
    times, interleaved.

    Returns:
        Seconds of the first `fit` and milliseconds per steady step (medians
        over repeats), the per-repeat ratios and their medians.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, FEATURES)).astype("float32")
    y = x[:, :1] * 2.0
    first: dict[str, list[float]] = {"checked": [], "unchecked": []}
    steady: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for repeat in range(repeats):
        for name in first:
            with _check(name == "checked"):
                model = _build()
                start = time.perf_counter()
                model.fit(x[:batch], y[:batch], batch_size=batch, verbose=0)
                first[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
            steady[name].append((time.perf_counter() - start) / steps * 1e3)
        log(
            f"  repeat {repeat + 1}: "
            + ", ".join(
                f"{n} {first[n][-1]:.2f} s + {steady[n][-1]:.2f} ms" for n in first
            )
        )
    ratios = {
        "first": [c / u for c, u in zip(first["checked"], first["unchecked"])],
        "steady": [c / u for c, u in zip(steady["checked"], steady["unchecked"])],
    }
    return dict(
        batch=batch,
        steps=steps,
        repeats=repeats,
        towers=4,
        model=f"Dense {FEATURES}-{WIDTH}-{WIDTH}-1, mse, Adam",
        first_fit_s={n: round(statistics.median(t), 3) for n, t in first.items()},
        ms_per_step={n: round(statistics.median(t), 3) for n, t in steady.items()},
        raw_first_s=first,
        raw_ms=steady,
        ratios={k: round(statistics.median(v), 3) for k, v in ratios.items()},
        date=time.strftime("%Y-%m-%d"),
        python=platform.python_version(),
    )


def markdown(result: dict[str, Any]) -> str:
    """The result as a Markdown table and its caption."""
    first, ms, ratios = result["first_fit_s"], result["ms_per_step"], result["ratios"]
    return "\n".join(
        [
            "| | checked | unchecked | checked / unchecked |",
            "|---|---|---|---|",
            f"| first `fit` (one step, tracing) | {first['checked']:.2f} s | "
            f"{first['unchecked']:.2f} s | {ratios['first']:.2f} |",
            f"| steady step | {ms['checked']:.2f} ms | {ms['unchecked']:.2f} ms | "
            f"{ratios['steady']:.2f} |",
            "",
            f"{result['model']}, global batch {result['batch']} on 4 towers; median "
            f"over {result['repeats']} interleaved repeats of {result['steps']} "
            f"steps (`python -m bench.loss_check`, {result['date']}, 4 logical "
            "CPUs).",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return interleaved_main("loss_check", run, markdown, argv, steps=200)


if __name__ == "__main__":
    sys.exit(main())
