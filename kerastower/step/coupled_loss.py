"""Finding, at the first training step, a compiled loss that couples examples.

A loss that compares the examples of a batch with each other (a contrastive
loss with in-batch negatives, a loss scaled by a statistic of the batch)
has on a tower's shard another value than on the whole batch, so towers
that each compute it on their shard train another model than one device.
`kerastower.step.checks.couples_examples` refuses the Keras losses known to
do so before training; any other compiled loss is tried once, on the first
training step's real batch:

- a loss that returns one value per example (Keras's loss functions, a
  `keras.losses.Loss`'s ``call``) couples the examples when its values on the
  whole batch differ from its values on the towers' shards, concatenated;
- a loss that returns one scalar couples them when its value on the whole
  batch differs from the towers' values weighted by their shares ``n_i / B``
  (what the towers add up).

The first step then fails with a `ValueError` that names
``global_batch_loss=True``, before its gradients are applied. The check
runs once: later steps read one boolean variable. It is not made for a
`compute_loss` or `train_step` of the model's own (what they compute cannot
be recomputed on the whole batch without running them again), on several
workers, with ``global_batch_loss=True``, or on Keras 2.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.step.shards import split_nest, tensor_split_sizes

# Marks the error raised inside the step, turned into a `ValueError` by
# `raise_if_coupled`.
MARKER = "kerastower: the compiled loss compares the examples of a batch"
# Above float32 rounding of a loss computed on another number of rows.
RTOL = 1e-3


def message(names: list[str]) -> str:
    """The error for a compiled loss found to couple the examples."""
    return (
        f"{MARKER} ({', '.join(names)}): its value on the first batch differs "
        "from its values on the shards of the towers, so the towers would "
        "train another model than one device. Create the model with "
        "`global_batch_loss=True` to compute the loss on the whole batch. "
        "Received: global_batch_loss=False"
    )


class CoupledLossCheck:
    """The first-step check of one `TowerModel`'s compiled loss.

    Args:
        model: The `kerastower.TowerModel`.
    """

    def __init__(self, model: keras.Model):
        self.model = model
        # Made here, not while the step traces: a variable made in a trace
        # makes `tf.function` trace the step a second time.
        with tf.init_scope():
            self._done = tf.Variable(False, trainable=False, name="loss_checked")

    def applies(self) -> bool:
        """Whether this model's steps are checked."""
        model = self.model
        return (
            model.num_towers > 1
            and model.num_workers == 1
            and not model.global_batch_loss
            and type(model).compute_loss is keras.Model.compute_loss
            and bool(_compiled_losses(model))
        )

    def check(self, y: Any, y_pred: Any, batch: tf.Tensor) -> list:
        """The ops that check the batch once: ``[]`` where nothing is checked.

        The update of the step should wait for them (`after`).

        Args:
            y: The global batch's targets.
            y_pred: The model's predictions for it, in input order.
            batch: ``B``, its examples (int32 scalar).
        """
        if not self.applies():
            return []
        pairs = _pairs(_compiled_losses(self.model), y, y_pred)
        if not pairs:
            return []
        if tf.inside_function():
            # Each new trace (a new compile, a new batch shape) checks again.
            with tf.init_scope():
                self._done.assign(False)
        towers = self.model.num_towers
        sizes = tensor_split_sizes(batch, towers)
        names = [_name(fn) for fn, _, _ in pairs]

        def first_step():
            couples = [_couples(fn, t, p, sizes, towers) for fn, t, p in pairs]
            ok = tf.logical_not(tf.reduce_any(tf.stack(couples)))
            assertion = tf.debugging.Assert(ok, [message(names)])
            with tf.control_dependencies([assertion]):
                # A batch smaller than 2 towers compares nothing: the next does.
                return self._done.assign(tf.math.count_nonzero(sizes) > 1)

        return [tf.cond(self._done, lambda: tf.constant(True), first_step)]


def _compiled_losses(model: keras.Model) -> Any:
    return _keras_compat.compiled_loss(model)


def _pairs(losses: Any, y: Any, y_pred: Any) -> list[tuple]:
    """``(loss function, targets, predictions)`` per output, where the
    compiled losses line up with the outputs; else ``[]`` (not checked)."""
    if isinstance(losses, dict):
        if not (isinstance(y, dict) and isinstance(y_pred, dict)):
            return []
        if not set(losses) <= set(y) & set(y_pred):
            return []
        items = [(losses[k], y[k], y_pred[k]) for k in sorted(losses)]
    else:
        flat_losses = tf.nest.flatten(losses)
        flat_y, flat_pred = tf.nest.flatten(y), tf.nest.flatten(y_pred)
        if not (len(flat_losses) == len(flat_y) == len(flat_pred)):
            return []
        items = list(zip(flat_losses, flat_y, flat_pred, strict=True))
    # A list of losses for one output, or anything else, is not checked.
    return [
        (_function(loss), t, p)
        for loss, t, p in items
        if (isinstance(loss, str) or callable(loss))
        and t is not None
        and isinstance(p, tf.Tensor)
    ]


def _function(loss: Any):
    """The per-example function of a compiled loss."""
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss) and (
        type(loss).__call__ is keras.losses.Loss.__call__
    ):
        return loss.call
    return loss  # a function, or a `Loss` with a `__call__` of its own


def _name(fn: Any) -> str:
    owner = getattr(fn, "__self__", fn)
    return getattr(owner, "name", None) or getattr(fn, "__name__", None) or repr(fn)


def _couples(fn, y_true, y_pred, sizes, towers) -> tf.Tensor:
    """Whether `fn`'s values on the whole batch differ from its shards'."""
    whole = tf.convert_to_tensor(fn(y_true, y_pred))
    shards = zip(
        split_nest(y_true, sizes, towers),
        split_nest(y_pred, sizes, towers),
        strict=True,
    )
    parts = [tf.cast(fn(t, p), whole.dtype) for t, p in shards]
    if whole.shape.rank == 0:
        shares = tf.cast(sizes, whole.dtype) / tf.cast(
            tf.reduce_sum(sizes), whole.dtype
        )
        weighted = [tf.math.multiply_no_nan(p, shares[i]) for i, p in enumerate(parts)]
        difference = tf.abs(whole - tf.add_n(weighted))
        scale = tf.abs(whole) + tf.add_n([tf.abs(w) for w in weighted])
    else:
        combined = tf.concat(parts, axis=0)
        difference = tf.reduce_max(tf.abs(whole - combined))
        scale = tf.reduce_max(tf.abs(whole))
    tiny = tf.constant(1e-30, whole.dtype)
    return difference > RTOL * scale + tiny


def raise_if_coupled(error: BaseException) -> None:
    """Raises the check's `ValueError` for the step's error it caused."""
    if isinstance(error, tf.errors.InvalidArgumentError) and MARKER in str(error):
        text = str(error)
        start = text.index(MARKER)
        end = text.find("Received: global_batch_loss=False", start)
        end = len(text) if end < 0 else end + len("Received: global_batch_loss=False")
        raise ValueError(text[start:end]) from None


def after(checks: list, gradients: list) -> list:
    """`gradients`, available once `checks` have run.

    Only the gradients wait, not the whole update: the optimizer's step
    counter does not depend on the batch, and Keras counts it even for a
    `fit` on no data.
    """
    if not checks:
        return gradients
    with tf.control_dependencies(checks):
        return [_identity(g) for g in gradients]


def _identity(gradient: Any) -> Any:
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.identity(gradient.values), gradient.indices, gradient.dense_shape
        )
    return tf.identity(gradient)
