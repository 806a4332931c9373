"""`TowerModel` on Keras's JAX backend: four CPU devices of JAX's own
(``XLA_FLAGS``, tests/conftest.py) and float64 available (``jax_enable_x64``,
set before Keras makes a variable)."""

import jax

jax.config.update("jax_enable_x64", True)
