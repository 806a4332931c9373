"""Metrics updated inside a tower: a `keras.metrics.Mean` of a batch scalar.

A `keras.metrics.Mean` updated with a scalar ``v`` adds ``v`` to its total
and 1 to its count. One device updates it once per step, with the batch's
``v`` (a custom `compute_loss` tracking its loss, say). Towers update it once
each, with their shard's ``v_i``: the count would grow by ``N`` per step and
the mean be the towers' unweighted mean.

While `scalar_means_weighted` is open in a tower's thread, such an update
waits until the tower's loss is weighed (`weigh_scalar_means`) and is made
then with sample weight ``f_i`` (times the one given): ``f_i`` is the factor
that turned the tower's loss ``L_i`` into its weighted share of the batch's
loss, ``sum_i f_i L_i = L`` (`kerastower.step.loss_weighting`), or the
tower's share of the examples ``n_i / B`` for a tower that weighs no loss.
The step adds ``sum_i f_i v_i`` to the total and ``sum_i f_i`` to the count:
for ``v`` the loss (or a multiple of it) that is ``L`` and 1, one device's
update, masked losses included; for another batch mean, a mean weighted by
the towers' shares of the loss.

Every other update made in a tower (values with examples on an axis, as
``update_state(y_true, y_pred)``, or another metric class) is made at once
and adds up over the towers: one device's value for per-example updates and
for sums.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator

import tensorflow as tf

from kerastower._keras_compat.errors import _fail
from kerastower._keras_compat.family import keras

_local = threading.local()
_lock = threading.Lock()
_open = 0
_original = None  # `Mean.update_state` while patched
_own = False  # whether `Mean` defined it itself, not inherited


def _check_mean() -> None:
    method = getattr(keras.metrics.Mean, "update_state", None)
    if not callable(method) or list(inspect.signature(method).parameters) != [
        "self",
        "values",
        "sample_weight",
    ]:
        raise _fail(
            "keras.metrics.Mean.update_state(values, sample_weight)",
            "is missing or changed",
        )


def _deferred_update_state(self, values, sample_weight=None):
    pending = getattr(_local, "pending", None)
    if pending is not None and tf.convert_to_tensor(values).shape.rank == 0:
        pending.append((self, values, sample_weight))
        return None
    return _original(self, values, sample_weight=sample_weight)


def weigh_scalar_means(factor: Callable[[], tf.Tensor]) -> None:
    """Makes this tower's waiting scalar `Mean` updates, weighted by `factor`.

    Args:
        factor: Returns ``f_i``, what the tower's loss was multiplied by;
            called only when an update waits.
    """
    pending = getattr(_local, "pending", None)
    if not pending:
        return
    factor = tf.stop_gradient(factor())
    _local.pending = None  # the updates below are made, not deferred
    try:
        for metric, values, sample_weight in pending:
            weight = tf.cast(factor, metric.dtype)
            if sample_weight is not None:
                weight = tf.cast(sample_weight, metric.dtype) * weight
            _original(metric, values, sample_weight=weight)
    finally:
        pending.clear()
        _local.pending = pending


@contextlib.contextmanager
def scalar_means_weighted(share: tf.Tensor) -> Iterator[None]:
    """Defers this thread's scalar `keras.metrics.Mean` updates while open.

    Open it around one tower's step. Updates still waiting when it closes
    are weighted by `share`.

    Args:
        share: The tower's share ``n_i / B`` of the global batch.

    Raises:
        KerasCompatibilityError: If `keras.metrics.Mean.update_state` no
            longer takes ``(values, sample_weight)``.
    """
    global _open, _original, _own
    with _lock:
        if _open == 0:
            _check_mean()
            _original = keras.metrics.Mean.update_state
            _own = "update_state" in vars(keras.metrics.Mean)
            keras.metrics.Mean.update_state = _deferred_update_state
        _open += 1
    previous = getattr(_local, "pending", None)
    _local.pending = []
    try:
        yield
        weigh_scalar_means(lambda: share)
    finally:
        _local.pending = previous
        with _lock:
            _open -= 1
            if _open == 0:
                if _own:
                    keras.metrics.Mean.update_state = _original
                else:
                    del keras.metrics.Mean.update_state
