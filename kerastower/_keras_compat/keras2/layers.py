"""Keras 2 layer state in towers: what a tower's forward pass assigns.

Keras 3 runs the towers after the first inside a `keras.StatelessScope`
that holds their assignments (`kerastower._keras_compat.layers`). Keras 2
layers assign TensorFlow variables directly and have no such scope: here a
tower reads and assigns the model's variables as they are, so only models
whose forward pass assigns no weight train exactly on towers. Keras 2's
`BatchNormalization` is refused on towers (`trainer.build_before_towers`);
Keras 2 has no `SpectralNormalization`. An activity regularizer's penalty is
already a batch mean in Keras 2 (``Layer._handle_activity_regularization``
divides it by the batch size).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kerastower._keras_compat.errors import KerasCompatibilityError

# Keras 2 has no spectral normalisation layer of its own.
SPECTRAL_NORMALIZATION: tuple = ()


# Keras 2 has no scope that holds a tower's assignments (Keras 3's
# `StatelessScope`): every tower reads and assigns the model's variables.
RECORDS_ASSIGNMENTS = False


@contextlib.contextmanager
def activity_penalties_summed(layers, global_batch) -> Iterator[None]:
    """Nothing to change: Keras 2's activity penalty is a batch mean."""
    del layers, global_batch
    yield


def _no_spectral_normalization(*args):
    del args
    raise KerasCompatibilityError("Keras 2 has no `SpectralNormalization` layer.")


spectral_update = _no_spectral_normalization
freeze_spectral_update = _no_spectral_normalization
restore_spectral_update = _no_spectral_normalization
