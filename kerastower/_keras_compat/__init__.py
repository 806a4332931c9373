"""The private Keras, TensorFlow and JAX hooks kerastower relies on, each checked.

Public Keras API is used wherever one exists. What has none (a loss's
per-element values and mask, Keras's masking of sample weights) is reached
here and nowhere else, and each hook is checked once against the installed
Keras: when Keras changes one, the user gets an error that names the hook
and the Keras version, never a silently different model.

The fence is laid out by backend, one sibling folder each:

- `keras3/` and `keras2/`: what differs between the Keras families on
  TensorFlow, in modules of the same names (`callbacks`, `layers`, `losses`,
  `optimizers`, `trainer`) that export the same names (their ``__all__``; a
  test checks the parity). `family` says which Keras is in use (Keras 3, or
  Keras 2: `tf.keras` on TensorFlow 2.12 to 2.15, `tf_keras` after). Code
  outside the fence asks the family questions (``why_no_replicas()``,
  ``track_step_loss``) and never branches on the family itself (a test
  checks).
- `tensorflow/`: TensorFlow-private step machinery for either family:
  `collectives` (the multi-worker start-up), `tower_calls` (one traced tower
  function called on every device), `grappler_once` (its body optimised
  once for every device) and `xla` (XLA per tower).
- `jax/`: Keras 3 on JAX, which `kerastower.on_jax` imports itself; on JAX
  neither TensorFlow nor the rest of the fence is loaded.
- Beside them, for either Keras family on TensorFlow: `errors` (the error
  and the supported ranges), `step_functions` (Keras's ``make_*_function``),
  `metrics` (a `Mean` of a batch scalar updated in a tower), `seeds` (Keras's
  global seed generator in the towers' threads), `precision` and
  `checkpoints`; the functional variants are plain Python
  (`kerastower._functional_variants`).
- `keras3_functional`: Keras 3's functional-model internals, which `keras3/`
  and `jax/` both load (plain Keras, no backend).

On TensorFlow this package hands on the names of `interface`: one family's,
with TensorFlow's machinery. A backend is one more folder, and its own line
here.
"""

from kerastower import _installed_keras

if _installed_keras.backend() != _installed_keras.JAX_BACKEND:
    from kerastower._keras_compat.interface import *  # noqa: F403
    from kerastower._keras_compat.interface import __all__  # noqa: F401
