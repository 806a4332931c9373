"""Pure math for scaling the learning rate with the global batch size.

Users choose a **per-tower** batch size ``b`` and a learning rate ``lr_0`` tuned
for a reference batch of ``B_0`` examples. Worker ``i`` of ``W`` has ``N_i``
towers and passes its own batch ``b * N_i`` to `fit`; every step sees the
**global** batch, the sum over workers,

    B = b * (N_1 + ... + N_W)    (b * N * W when every worker has N towers)

and the learning rate follows the global batch (Goyal et al. 2017,
"Accurate, Large Minibatch SGD"):

    linear:  lr_target = lr_0 * B / B_0
    sqrt:    lr_target = lr_0 * sqrt(B / B_0)

A gradual warmup moves from ``lr_0`` to ``lr_target`` over ``E_w`` epochs,
updated every batch. At batch ``j`` (0-based) of epoch ``k`` (0-based) with
``S`` steps per epoch, the warmup has covered ``e = k + (j + 1) / S`` epochs
and

    lr(e) = lr_0 + (lr_target - lr_0) * min(e / E_w, 1)

(``lr_target`` throughout when ``E_w = 0``). The value depends only on
``(k, j, S)``, so a run resumed at epoch ``k`` uses the same rates as an
uninterrupted one.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from kerastower._keras_compat.family import keras

RULES = ("linear", "sqrt")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive_int(name: str, value: Any) -> int:
    """Returns ``value`` as an ``int``; raises unless it is an integer >= 1."""
    if not _is_int(value) or value < 1:
        raise ValueError(
            f"`{name}` must be an integer >= 1. Received: {name}={value!r}"
        )
    return int(value)


def check_positive_float(name: str, value: Any) -> float:
    """Returns ``value`` as a ``float``; raises unless it is a finite number > 0."""
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"`{name}` must be a finite number > 0. Received: {name}={value!r}"
        )
    return float(value)


def check_rule(rule: Any) -> str:
    """Returns ``rule``; raises unless it is one of `RULES`."""
    if rule not in RULES:
        raise ValueError(
            f"`rule` must be one of {', '.join(repr(r) for r in RULES)}. "
            f"Received: rule={rule!r}"
        )
    return rule


def check_warmup_epochs(warmup_epochs: Any) -> float:
    """Returns ``warmup_epochs`` as a ``float``; raises unless it is >= 0."""
    if (
        not _is_real(warmup_epochs)
        or not math.isfinite(warmup_epochs)
        or warmup_epochs < 0
    ):
        raise ValueError(
            "`warmup_epochs` must be a finite number >= 0. "
            f"Received: warmup_epochs={warmup_epochs!r}"
        )
    return float(warmup_epochs)


def towers_and_workers(towers_or_model: Any) -> tuple[int, int]:
    """Returns ``(towers of this worker, workers)`` for a tower count or a model.

    Args:
        towers_or_model: An integer of at least 1, a number of towers
            (returned as ``(towers_or_model, 1)``); or a model, whose
            ``num_towers`` (1 for a plain `keras.Model`) and ``num_workers``
            (1 when absent) are read.

    Returns:
        A pair of integers of at least 1.

    Raises:
        ValueError: If the count, or the model's attributes, are not integers
            of at least 1.
    """
    if _is_int(towers_or_model) or isinstance(towers_or_model, bool):
        return check_positive_int("towers_or_model", towers_or_model), 1
    if not isinstance(towers_or_model, keras.Model):
        raise ValueError(
            "`towers_or_model` must be an integer >= 1 or a model. "
            f"Received: towers_or_model={towers_or_model!r}"
        )
    towers = check_positive_int("num_towers", getattr(towers_or_model, "num_towers", 1))
    workers = check_positive_int(
        "num_workers", getattr(towers_or_model, "num_workers", 1)
    )
    return towers, workers


def worker_batch_size(per_tower_batch_size: int, towers_or_model: Any) -> int:
    """Returns the batch of **this worker**: what its `model.fit` takes.

    ``per_tower_batch_size * towers``, with ``towers`` this worker's towers:
    the integer `towers_or_model`, or the model's ``num_towers`` (1 for a
    plain `keras.Model`). On one worker it is the global batch; on several,
    each worker passes its own, and the global batch is their sum.

    Args:
        per_tower_batch_size: The number of examples each tower processes per
            step, an integer of at least 1.
        towers_or_model: This worker's number of towers, an integer of at
            least 1; or a `keras.Model`.

    Returns:
        This worker's batch size, an integer of at least 1.

    Raises:
        ValueError: If `per_tower_batch_size` is not an integer of at least 1
            or `towers_or_model` is neither such an integer nor a model.
    """
    per_tower = check_positive_int("per_tower_batch_size", per_tower_batch_size)
    towers, _ = towers_and_workers(towers_or_model)
    return per_tower * towers


def global_batch_size(per_tower_batch_size: int, towers_or_model: Any) -> int:
    """Returns the global batch size for a per-tower batch size.

    The **global** batch is what one training step sees over all towers and
    workers: ``B = per_tower_batch_size * towers``, with ``towers`` the
    towers of all workers together.

    - With an integer `towers_or_model`, that integer is the towers of all
      workers together.
    - With a model on one worker, ``towers = model.num_towers``: ``B`` is then
      also what `model.fit` takes as ``batch_size``.
    - With a model on several workers, ``towers = model.num_towers *
      model.num_workers``: this assumes that **every worker has as many
      towers** as this one, which the model cannot know without asking the
      other workers (`kerastower.callbacks.BatchScaling` asks them, and
      counts workers with different numbers of towers exactly). Each worker
      passes its own batch, ``per_tower_batch_size * model.num_towers``, to
      `model.fit`, not ``B``.

    Example:

    ```python
    >>> import keras
    >>> import kerastower
    >>> kerastower.global_batch_size(32, 4)
    128
    >>> inputs = keras.Input((8,))
    >>> model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs), towers=1)
    >>> kerastower.global_batch_size(32, model)  # 32 x model.num_towers
    32
    ```

    Args:
        per_tower_batch_size: The number of examples each tower processes per
            step, an integer of at least 1.
        towers_or_model: The number of towers over all workers, an integer
            of at least 1; or a `keras.Model`, whose ``num_towers`` (1 for a
            plain `keras.Model`) times its ``num_workers`` (1 when absent) is
            used.

    Returns:
        The global batch size, an integer of at least 1.

    Raises:
        ValueError: If `per_tower_batch_size` is not an integer of at least 1
            or `towers_or_model` is neither such an integer nor a model.
    """
    per_tower = check_positive_int("per_tower_batch_size", per_tower_batch_size)
    towers, workers = towers_and_workers(towers_or_model)
    return per_tower * towers * workers


def target_learning_rate(
    base_learning_rate: float,
    base_batch_size: int,
    global_batch_size: int,
    rule: str = "linear",
) -> float:
    """Returns the learning rate for a global batch, scaled from a reference.

    With ``lr_0 = base_learning_rate`` tuned for ``B_0 = base_batch_size``
    examples and a **global** batch of ``B`` examples (all towers and workers):

    - ``"linear"``: ``lr_target = lr_0 * B / B_0`` (Goyal et al. 2017);
    - ``"sqrt"``: ``lr_target = lr_0 * sqrt(B / B_0)`` (often used with Adam).

    Example:

    ```python
    >>> target_learning_rate(0.1, 256, 1024)
    0.4
    >>> target_learning_rate(0.1, 256, 1024, rule="sqrt")
    0.2
    ```

    Args:
        base_learning_rate: ``lr_0``, a finite number > 0.
        base_batch_size: ``B_0``, the global batch size ``lr_0`` was tuned for,
            an integer >= 1.
        global_batch_size: ``B``, the global batch size of the run, an
            integer of at least 1.
        rule: ``"linear"`` or ``"sqrt"``. Defaults to ``"linear"``.

    Returns:
        ``lr_target`` as a float.

    Raises:
        ValueError: If a rate or size is not positive or `rule` is unknown.
    """
    base = check_positive_float("base_learning_rate", base_learning_rate)
    ratio = check_positive_int("global_batch_size", global_batch_size) / (
        check_positive_int("base_batch_size", base_batch_size)
    )
    if check_rule(rule) == "sqrt":
        return base * math.sqrt(ratio)
    return base * ratio


def warmup_progress(epoch: int, batch: int, steps_per_epoch: int) -> float:
    """Returns ``e = epoch + (batch + 1) / steps_per_epoch``, epochs done.

    Args:
        epoch: The 0-based epoch index ``k``, an integer >= 0.
        batch: The 0-based batch index ``j`` within the epoch, an integer >= 0.
        steps_per_epoch: ``S``, the number of batches per epoch, an integer >= 1.

    Returns:
        The number of epochs completed after batch ``j``, as a float.
    """
    if not _is_int(epoch) or epoch < 0:
        raise ValueError(f"`epoch` must be an integer >= 0. Received: epoch={epoch!r}")
    if not _is_int(batch) or batch < 0:
        raise ValueError(f"`batch` must be an integer >= 0. Received: batch={batch!r}")
    steps = check_positive_int("steps_per_epoch", steps_per_epoch)
    return epoch + (batch + 1) / steps


def warmup_learning_rate(
    epoch: int,
    batch: int,
    steps_per_epoch: int | None,
    base_learning_rate: float,
    target_learning_rate: float,
    warmup_epochs: float,
) -> float:
    """Returns the learning rate at one batch of a gradual linear warmup.

    With ``e = epoch + (batch + 1) / steps_per_epoch`` epochs completed,

    ``lr(e) = lr_0 + (lr_target - lr_0) * min(e / warmup_epochs, 1)``,

    so the rate rises by equal steps from just above ``lr_0`` at the first
    batch to exactly ``lr_target`` at the last batch of the warmup, and stays
    there. ``warmup_epochs = 0`` gives ``lr_target`` at every batch.

    Example:

    ```python
    >>> warmup_learning_rate(0, 1, 4, 0.5, 2.5, warmup_epochs=1)  # e = 0.5
    1.5
    ```

    Args:
        epoch: The 0-based epoch index, an integer >= 0.
        batch: The 0-based batch index within the epoch, an integer >= 0.
        steps_per_epoch: The number of batches per epoch, an integer >= 1;
            may be ``None`` when `warmup_epochs` is 0.
        base_learning_rate: ``lr_0``, a finite number > 0.
        target_learning_rate: ``lr_target``, a finite number > 0.
        warmup_epochs: ``E_w``, the warmup length in epochs, a number >= 0.

    Returns:
        ``lr(e)`` as a float.

    Raises:
        ValueError: If an argument is out of range.
    """
    base = check_positive_float("base_learning_rate", base_learning_rate)
    target = check_positive_float("target_learning_rate", target_learning_rate)
    warmup = check_warmup_epochs(warmup_epochs)
    if warmup == 0:
        return target
    done = warmup_progress(epoch, batch, steps_per_epoch)
    return base + (target - base) * min(done / warmup, 1.0)
