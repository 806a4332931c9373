"""Batching `tf.data` pipelines for towers."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kerastower.scaling import worker_batch_size


def batch_for_towers(
    dataset: tf.data.Dataset,
    per_tower_batch_size: int,
    towers_or_model: Any,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """Batches an unbatched dataset into this worker's batches for its towers.

    Each element of the result is one batch of ``per_tower_batch_size *
    towers`` examples, with ``towers`` the towers of **this worker**
    (``model.num_towers``); `TowerModel` then gives each tower
    ``per_tower_batch_size`` of them. Pass the result to `model.fit` without a
    ``batch_size``.

    On one worker this batch is the **global** batch, what one step sees. On
    several workers (see `kerastower.worker_strategy`) each worker batches its
    own part of the data this way, and one step sees every worker's batch:
    the global batch is their sum, ``per_tower_batch_size`` times the towers
    of all workers together (`kerastower.callbacks.BatchScaling` scales the
    learning rate with it). A worker with 2 towers and one with 3, at 32
    examples a tower, batch 64 and 96 examples: a global batch of 160.

    Example:

    ```python
    import keras
    import numpy as np
    import tensorflow as tf

    import kerastower

    kerastower.configure_logical_devices(4)  # without GPUs: 4 logical CPUs

    inputs = keras.Input((8,))
    model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="adam", loss="mse")

    x = np.random.default_rng(0).normal(size=(1000, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1000, seed=0)
    train = kerastower.batch_for_towers(dataset, 32, model)  # 32 x 4 = 128
    model.fit(train, epochs=3)
    ```

    Args:
        dataset: An unbatched `tf.data.Dataset`, one example per element.
        per_tower_batch_size: The number of examples per tower and step, an
            integer of at least 1.
        towers_or_model: The number of towers of this worker, an integer of
            at least 1; or a model, whose ``num_towers`` (1 for a plain
            `keras.Model`) is used.
        drop_remainder: Whether to drop a last batch that is smaller than the
            others, so that every step sees the same global batch size.
            Defaults to ``False``.

    Returns:
        The batched `tf.data.Dataset`.

    Raises:
        ValueError: If `dataset` is not a `tf.data.Dataset`, or a size is not
            an integer >= 1.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            "`dataset` must be a tf.data.Dataset. "
            f"Received: dataset={type(dataset).__name__}"
        )
    batch = worker_batch_size(per_tower_batch_size, towers_or_model)
    return dataset.batch(batch, drop_remainder=bool(drop_remainder))
