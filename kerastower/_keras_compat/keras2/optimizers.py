"""An optimizer's copy for each tower's replicas: not ported to Keras 2 yet.

The Keras 3 implementation is `kerastower._keras_compat.keras3.optimizers`.
"""

from __future__ import annotations

from kerastower._keras_compat.errors import KerasCompatibilityError
from kerastower._keras_compat.family import describe

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "build_optimizer",
    "clone_optimizer",
    "why_no_replicas",
]


def why_no_replicas() -> str | None:
    """Why towers cannot train on replicas of the variables."""
    return "on Keras 2, towers read the model's variables"


def build_optimizer(optimizer, variables) -> None:
    """Makes `optimizer`'s state for `variables`, unless it has it (Keras 2's
    ``build`` returns at once when ``_built``).

    Raises:
        ValueError: For a legacy optimizer (``keras.optimizers.legacy``),
            which makes its state as it applies gradients.
    """
    build = getattr(optimizer, "build", None)
    if not callable(build):
        raise ValueError(
            "kerastower needs a Keras 2 optimizer of `keras.optimizers` (not "
            f"`keras.optimizers.legacy`). Received: optimizer={optimizer!r}"
        )
    build(list(variables))


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
