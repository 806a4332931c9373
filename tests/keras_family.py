"""The Keras the tests build models with: the one kerastower runs on.

Keras 3, or Keras 2 (`tf.keras` on TensorFlow 2.12 to 2.15, `tf_keras` under
``TF_USE_LEGACY_KERAS=1``); see `kerastower._keras_compat.family`. A test
module that runs on both imports `keras` from here; what one family lacks is
marked `keras3_only` or `keras2_only`.
"""

import pytest

from kerastower._keras_compat.family import KERAS_FAMILY, KERAS_VERSION, keras

KERAS_2 = KERAS_FAMILY == 2
if KERAS_2:
    from kerastower._keras_compat.keras2.layers import SPECTRAL_NORMALIZATION
else:
    from kerastower._keras_compat.keras3.layers import SPECTRAL_NORMALIZATION
# The installed Keras as ``(major, minor)``, for what differs between releases.
KERAS_MINOR = tuple(int(part) for part in KERAS_VERSION.split(".")[:2])

keras3_only = pytest.mark.skipif(KERAS_2, reason="Keras 3 only")
keras2_only = pytest.mark.skipif(not KERAS_2, reason="Keras 2 only")


# Keras 2.12 has no `SpectralNormalization` layer; that of Keras 2.13 to
# `tf_keras` 2.18 cannot be traced: a `fit` fails on it, on one device too.
# kerastower updates the ones that trace (`SPECTRAL_NORMALIZATION`).
spectral_normalization = pytest.mark.skipif(
    not SPECTRAL_NORMALIZATION,
    reason=f"Keras {KERAS_VERSION} has no SpectralNormalization that traces",
)


def keras3_only_until_ported(reason: str):
    """Skips on Keras 2 a capability that kerastower does not have there yet."""
    return pytest.mark.skipif(KERAS_2, reason=f"not on Keras 2 yet: {reason}")


__all__ = [
    "KERAS_2",
    "KERAS_FAMILY",
    "KERAS_MINOR",
    "keras",
    "keras2_only",
    "keras3_only",
    "keras3_only_until_ported",
    "spectral_normalization",
]
