"""kerastower on Keras 3's JAX backend: `TowerModel` as one program over the
towers' devices (`placement`, `steps`, `model`).

Imported by ``import kerastower`` when Keras runs on JAX
(``KERAS_BACKEND=jax``), in place of the TensorFlow modules, none of which
it imports.
"""

from kerastower.on_jax.model import TowerModel

__all__ = ["TowerModel"]
