"""``python -m bench.gather``: the cost of ``global_batch_loss``.

With ``TowerModel(..., global_batch_loss=True)`` every tower all-reduces the
batch's predictions, targets and sample weights (zero-padded to the global
batch, `kerastower.reduce.towers.gather_over_towers`) and computes the loss
of the whole batch. This times a training step of an in-batch contrastive
encoder (the case the option exists for) with and without the option, on the
same towers, interleaved, in one process on 4 logical CPUs:

- ``plain``: a `keras.Model` on one device (the oracle);
- ``shards``: `TowerModel(towers=4)`, each tower's loss on its shard (fast,
  but not one device's model for this loss: compiled, the first step
  refuses it, so it is computed in a `compute_loss` of the model's own,
  which the first step does not check);
- ``gathered``: `TowerModel(towers=4, global_batch_loss=True)`.

The ratio ``gathered / shards`` is the price of exactness here. Logical CPUs
share the machine's cores: a ratio, not a speed.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from typing import Any

from bench.timing import interleaved_main

FEATURES, WIDTH, EMBEDDING = 32, 256, 64


def in_batch_contrastive(y_true, y_pred):
    """Each example's targets are the batch's other examples with its label."""
    import keras

    z = y_pred / (keras.ops.norm(y_pred, axis=1, keepdims=True) + 1e-6)
    logits = keras.ops.matmul(z, keras.ops.transpose(z)) / 0.5
    y_true = keras.ops.reshape(keras.ops.cast(y_true, "float32"), (-1, 1))
    same = keras.ops.cast(
        keras.ops.equal(y_true, keras.ops.transpose(y_true)), "float32"
    )
    targets = same / keras.ops.sum(same, axis=1, keepdims=True)
    return keras.losses.categorical_crossentropy(targets, logits, from_logits=True)


def _build(variant: str):
    import keras

    import kerastower

    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(WIDTH, activation="relu")(inputs)
    h = keras.layers.Dense(WIDTH, activation="relu")(h)
    model = keras.Model(inputs, keras.layers.Dense(EMBEDDING)(h))
    if variant == "shards":
        model = _shard_loss_class().from_model(model, towers=4)
        model.compile(optimizer="adam")
        return model
    if variant == "gathered":
        model = kerastower.TowerModel.from_model(
            model, towers=4, global_batch_loss=True
        )
    model.compile(optimizer="adam", loss=in_batch_contrastive)
    return model


def _shard_loss_class():
    import keras

    import kerastower

    class ShardLoss(kerastower.TowerModel):
        """The contrastive loss of each tower's shard, in `compute_loss`."""

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **_):
            return keras.ops.mean(in_batch_contrastive(y, y_pred))

    return ShardLoss


def run(batch: int, steps: int, repeats: int, log=print) -> dict[str, Any]:
    """Times ``steps`` training steps per variant, ``repeats`` times, interleaved.

    Returns:
        Milliseconds per step (median over repeats of each repeat's mean),
        the per-repeat ratios and their medians, and the gather's bytes.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, FEATURES)).astype("float32")
    y = rng.integers(0, 8, size=(batch * steps, 1)).astype("float32")
    models = {name: _build(name) for name in ("plain", "shards", "gathered")}
    for model in models.values():  # trace and warm up
        model.fit(x[: batch * 2], y[: batch * 2], batch_size=batch, verbose=0)
    times: dict[str, list[float]] = {name: [] for name in models}
    for repeat in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
            times[name].append((time.perf_counter() - start) / steps * 1e3)
        log(
            f"  repeat {repeat + 1}: "
            + ", ".join(f"{n} {t[-1]:.2f} ms" for n, t in times.items())
        )
    ratios = {
        "gathered/shards": [g / s for g, s in zip(times["gathered"], times["shards"])],
        "gathered/plain": [g / p for g, p in zip(times["gathered"], times["plain"])],
    }
    # Each tower all-reduces B rows of predictions and targets (float32).
    gathered_bytes = batch * (EMBEDDING + 1) * 4
    return dict(
        batch=batch,
        steps=steps,
        repeats=repeats,
        towers=4,
        model=f"Dense {FEATURES}-{WIDTH}-{WIDTH}-{EMBEDDING}, "
        "in-batch contrastive loss",
        ms_per_step={n: round(statistics.median(t), 3) for n, t in times.items()},
        raw_ms=times,
        ratios={k: round(statistics.median(v), 3) for k, v in ratios.items()},
        per_repeat_ratios={k: [round(r, 3) for r in v] for k, v in ratios.items()},
        gathered_bytes_per_tower=gathered_bytes,
        date=time.strftime("%Y-%m-%d"),
        python=platform.python_version(),
    )


def markdown(result: dict[str, Any]) -> str:
    """The result as the Markdown the Benchmarks page includes."""
    ms, ratios = result["ms_per_step"], result["ratios"]
    return "\n".join(
        [
            "| one device | 4 towers, shard losses | 4 towers, `global_batch_loss` "
            "| gathered / shards | gathered / one device |",
            "|---|---|---|---|---|",
            f"| {ms['plain']:.2f} ms | {ms['shards']:.2f} ms | {ms['gathered']:.2f} ms "
            f"| {ratios['gathered/shards']:.2f} | {ratios['gathered/plain']:.2f} |",
            "",
            f"{result['model']}, global batch {result['batch']}; median over "
            f"{result['repeats']} interleaved repeats of {result['steps']} steps "
            f"(`python -m bench.gather`, {result['date']}, 4 logical CPUs on the "
            f"machine above). Each tower all-reduces "
            f"{result['gathered_bytes_per_tower'] / 1024:.1f} KiB of predictions "
            "and targets per step.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return interleaved_main("gather", run, markdown, argv, steps=50)


if __name__ == "__main__":
    sys.exit(main())
