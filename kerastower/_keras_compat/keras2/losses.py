"""What a Keras 2 loss divides by, and the masks Keras 2 keeps on tensors.

A Keras 2 `keras.losses.Loss` with the default reduction
(``"sum_over_batch_size"``, or ``"auto"``) divides the weighted sum of its
per-element losses by their number, except where a mask is present: the
mask of the predictions (a masked sequence) and the mask the per-element
losses carry (``ignore_class``), both ANDed, when it divides by the number
of valid elements (``losses_utils.apply_valid_mask``). The Keras 3
counterparts are in `kerastower._keras_compat.keras3.losses`.
"""

from __future__ import annotations

import tensorflow as tf

from kerastower._keras_compat.errors import _fail
from kerastower._keras_compat.family import keras
from kerastower._keras_compat.keras2.internals import internal

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "get_keras_mask",
    "loss_divisor",
    "set_keras_mask",
]

_losses_utils = internal("utils.losses_utils", "apply_valid_mask", "get_mask")


def get_keras_mask(tensor) -> tf.Tensor | None:
    """The Keras mask `tensor` carries, or ``None``."""
    return getattr(tensor, "_keras_mask", None)


def set_keras_mask(tensor, mask) -> None:
    """Attaches a Keras mask to `tensor` (``None`` removes it)."""
    tensor._keras_mask = mask


def loss_divisor(loss, y_true, y_pred, sample_weight=None) -> tf.Tensor | None:
    """``D``: what `loss` divides its weighted sum by, when it is not
    proportional to the examples; else ``None``.

    ``None`` (a batch mean) also for a loss that is not a `keras.losses.Loss`
    with Keras's own ``__call__``: its reduction is unknown.

    Returns:
        The number of valid elements, float64, for a mean-reduced loss with a
        mask; ``None`` otherwise.
    """
    del sample_weight
    if (
        not isinstance(loss, keras.losses.Loss)
        or type(loss).__call__ is not keras.losses.Loss.__call__
    ):
        return None
    if loss.reduction not in ("auto", "sum_over_batch_size"):
        return None
    in_mask = get_keras_mask(y_pred)
    out_mask = None
    if _ignores_a_class(loss):
        out_mask = get_keras_mask(loss.call(y_true, y_pred))
    masks = [m for m in (in_mask, out_mask) if m is not None]
    if not masks:
        return None
    mask = masks[0] if len(masks) == 1 else masks[0] & masks[1]
    return tf.reduce_sum(tf.cast(mask, tf.float64))


def _ignores_a_class(loss) -> bool:
    """Whether `loss` marks elements invalid itself (``ignore_class``)."""
    kwargs = getattr(loss, "_fn_kwargs", None)
    if kwargs is None:
        return False
    if not isinstance(kwargs, dict):  # pragma: no cover - depends on Keras
        raise _fail("LossFunctionWrapper._fn_kwargs", "is not a dict")
    return kwargs.get("ignore_class") is not None
