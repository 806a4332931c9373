"""An optimizer's copy for each tower's replicas: not ported to Keras 2 yet.

The Keras 3 implementation is `kerastower._keras_compat.optimizers`.
"""

from __future__ import annotations

from kerastower._keras_compat.errors import KerasCompatibilityError
from kerastower._keras_compat.family import describe


def clone_optimizer(optimizer, primaries, copies):
    """Raises: replicas (``replicate_variables=True``) need Keras 3 for now.

    Raises:
        KerasCompatibilityError: Always.
    """
    del primaries, copies
    raise KerasCompatibilityError(
        "`replicate_variables=True` is not supported on Keras 2 yet "
        f"({describe()}): create the model with `replicate_variables=False`, "
        f"or use Keras 3. Received: optimizer={type(optimizer).__name__}"
    )
