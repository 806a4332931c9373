"""Checking a model of your own: its towers against one device.

`compare_with_one_device` trains your model twice from the same initial
weights on the same batches, once on towers and once on one device, and
reports how far apart the two runs ended. In float64 (the default) the
towers of a model they can train agree with one device to rounding, about
``1e-15`` relative, so any larger difference is a real one.

In float32 the last bit of a sum depends on its order, and that order
differs with the number of towers, with the CPU's or GPU's kernels, even
with the order of a batch's examples on one device. Adam turns that rounding
in a near-zero gradient into a step of the learning rate's size, and a ReLU
or a max pooling can flip at a kink; training carries both on. So a float32
comparison after many steps measures the machine's rounding. The
**yardstick** measures it in the same run: one device trained on the same
batches, each with its examples in another order (the same examples, the
same math). Towers as close to one device as one device is to itself are
as exact as float32 allows.
"""

from kerastower import _installed_keras

_installed_keras.check_tensorflow_backend(
    "kerastower.testing",
    "On JAX, compare your model with one device as tests/on_jax/jax_oracle.py "
    "does: the same initial weights, shuffle=False, float64.",
)

from kerastower._keras_compat.precision import float_dtype
from kerastower.testing.comparison import (
    YARDSTICK_FACTOR,
    Comparison,
    compare_with_one_device,
)
from kerastower.testing.differences import relative_difference, reorder_batches

__all__ = [
    "YARDSTICK_FACTOR",
    "Comparison",
    "compare_with_one_device",
    "float_dtype",
    "relative_difference",
    "reorder_batches",
]
