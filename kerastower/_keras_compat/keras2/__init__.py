"""The Keras 2 hooks: `tf.keras` on TensorFlow 2.12 to 2.15, `tf_keras` after.

Each module here holds the Keras 2 counterparts of the Keras 3 hooks of the
same concern in `kerastower._keras_compat` (`trainer`, `losses`, `layers`,
`callbacks`); `kerastower._keras_compat` exports one family's hooks under
the same names, so the step, the loss weighting, the sums and the replicas
are written once. Keras 2 keeps its internals under ``keras.engine`` (2.12),
``keras.src.engine`` (2.13 to 2.15) or ``tf_keras.src.engine``: `internals`
finds them.
"""
