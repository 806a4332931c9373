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

Keras 3's `Mean` is patched in its class. Keras 2 binds each metric's
``update_state`` when the metric is made, so there the model's own `Mean`
metrics (`keras.Model.metrics`) are patched one by one.

Every other update made in a tower (values with examples on an axis, as
``update_state(y_true, y_pred)``, or another metric class) is made at once
and adds up over the towers: one device's value for per-example updates and
for sums.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

import tensorflow as tf

from kerastower._keras_compat.errors import check_method
from kerastower._keras_compat.family import KERAS_FAMILY, keras

_local = threading.local()
_lock = threading.Lock()
_open = 0
_undo: list = []  # what puts the patched `update_state`s back


def _check_mean() -> None:
    check_method(
        keras.metrics.Mean,
        "update_state",
        ["self", "values", "sample_weight"],
        "keras.metrics.Mean",
    )


def _deferred(update, dtype, values, sample_weight=None):
    """`update` (a `Mean`'s own ``update_state``), deferred for a scalar."""
    pending = getattr(_local, "pending", None)
    if pending is not None and tf.convert_to_tensor(values).shape.rank == 0:
        pending.append((update, dtype, values, sample_weight))
        return None
    return update(values, sample_weight=sample_weight)


def _patch_class() -> Callable[[], None]:
    """Keras 3: defers every `Mean`'s scalar updates; returns the undo."""
    original = keras.metrics.Mean.update_state
    own = "update_state" in vars(keras.metrics.Mean)

    def update_state(self, values, sample_weight=None):
        update = functools.partial(original, self)
        return _deferred(update, self.dtype, values, sample_weight)

    keras.metrics.Mean.update_state = update_state

    def undo():
        if own:
            keras.metrics.Mean.update_state = original
        else:
            del keras.metrics.Mean.update_state

    return undo


def _patch_instances(model) -> Callable[[], None]:
    """Keras 2: defers the scalar updates of `model`'s `Mean` metrics."""
    patched = []
    mean_update = keras.metrics.Mean.update_state
    for metric in getattr(model, "metrics", []):
        # Not the `Mean`s that take ``(y_true, y_pred)`` (accuracies).
        own = getattr(type(metric), "update_state", None) is mean_update
        if own and "update_state" in vars(metric):
            original = vars(metric)["update_state"]
            metric.update_state = functools.partial(_deferred, original, metric.dtype)
            patched.append((metric, original))

    def undo():
        for metric, original in patched:
            metric.update_state = original

    return undo


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
        for update, dtype, values, sample_weight in pending:
            weight = tf.cast(factor, dtype)
            if sample_weight is not None:
                weight = tf.cast(sample_weight, dtype) * weight
            update(values, sample_weight=weight)
    finally:
        pending.clear()
        _local.pending = pending


@contextlib.contextmanager
def scalar_means_weighted(share: tf.Tensor, model=None) -> Iterator[None]:
    """Defers this thread's scalar `keras.metrics.Mean` updates while open.

    Open it around one tower's step. Updates still waiting when it closes
    are weighted by `share`.

    Args:
        share: The tower's share ``n_i / B`` of the global batch.
        model: The model whose metrics the towers update (Keras 2 patches
            them one by one).

    Raises:
        KerasCompatibilityError: If `keras.metrics.Mean.update_state` no
            longer takes ``(values, sample_weight)``.
    """
    global _open
    with _lock:
        if _open == 0:
            _check_mean()
            _undo.append(
                _patch_class() if KERAS_FAMILY >= 3 else _patch_instances(model)
            )
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
                _undo.pop()()
