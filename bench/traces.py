"""How often `fit` traces the train step.

Python code in a `tf.function` runs only while the function traces, so a
wrapper around `model.train_step` sees every trace; it counts the distinct
graphs it is called in (stock `MirroredStrategy` calls the step once per
replica within one trace). The benchmark fits
23 examples with a global batch size of 8 for 3 epochs: every epoch has two
batches of 8 and a partial batch of 7, two distinct batch shapes in all, so a
model that does not retrace per epoch or per batch traces at most twice, and
only in the first epoch. A callback notes the epoch and batch of each trace.

Keras feeds batches with an unknown batch dimension, so in practice the traced
input shape is the same for every batch; a second trace in the first step
comes from `tf.function` tracing again after a first trace that created
variables (the optimizer's, when it is built lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from bench.workloads import Variant, Workload, build_variant, describe_error


class _Position(keras.callbacks.Callback):
    """Remembers the epoch and batch that `fit` is running."""

    def __init__(self):
        super().__init__()
        self.epoch = self.batch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.batch = batch


def count_traces(
    workload: Workload,
    variant: Variant,
    examples: int = 23,
    batch_size: int = 8,
    epochs: int = 3,
) -> dict[str, Any]:
    """Fits once and counts the traces of the train step.

    Args:
        workload: The model to fit (its own batch size is not used).
        variant: How to build it.
        examples: Training examples.
        batch_size: The global batch size.
        epochs: Epochs of the one `fit` call.

    Returns:
        ``{"traces", "distinct_batch_shapes", "batches", "traced_at",
        "traced_shapes", "pass"}`` (``traced_at`` holds ``[epoch, batch]``
        per trace; ``pass`` means at most one trace per distinct batch shape
        and none after the first epoch), or ``{"error": ...}`` if the variant
        cannot train on this data.
    """
    x, y = workload.data(1)
    reps = -(-examples // len(x))
    x, y = x.repeat(reps, axis=0)[:examples], y.repeat(reps, axis=0)[:examples]
    starts = range(0, examples, batch_size)
    shapes = {min(batch_size, examples - start) for start in starts}
    try:
        model = build_variant(workload, variant)
        traced_step = model.train_step
        position = _Position()
        graphs, traced_at, traced_shapes = [], [], []

        def counting_train_step(data):
            graph = tf.compat.v1.get_default_graph()
            if not any(graph is seen for seen in graphs):
                graphs.append(graph)
                traced_at.append([position.epoch, position.batch])
                traced_shapes.append(list(next(iter(tf.nest.flatten(data))).shape))
            return traced_step(data)

        model.train_step = counting_train_step
        model.fit(
            x,
            y,
            batch_size=batch_size,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            callbacks=[position],
        )
    except Exception as error:  # recorded in the results, not fatal
        return {"error": describe_error(error)}
    traces = len(traced_at)
    return {
        "traces": traces,
        "distinct_batch_shapes": len(shapes),
        "batches": epochs * -(-examples // batch_size),
        "traced_at": traced_at,
        "traced_shapes": traced_shapes,
        "pass": traces <= len(shapes) and all(e == 0 for e, _ in traced_at),
    }


def run_traces(
    workload: Workload, variants: Sequence[Variant], log=print
) -> dict[str, Any]:
    """Counts traces for each of `variants`; see `count_traces`."""
    results = {}
    for variant in variants:
        results[variant.name] = count_traces(workload, variant)
        log(f"  {variant.name:>14}: {results[variant.name]}")
    return {
        "workload": workload.name,
        "examples": 23,
        "batch_size": 8,
        "epochs": 3,
        "variants": results,
    }
