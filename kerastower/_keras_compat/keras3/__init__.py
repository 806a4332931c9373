"""The Keras 3 hooks: the ``keras`` package on its TensorFlow backend.

Each module exports, in its ``__all__``, the names its Keras 2 counterpart
in `kerastower._keras_compat.keras2` exports; `kerastower._keras_compat`
re-exports the family in use.
"""
