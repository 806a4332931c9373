"""What importing kerastower does to the process, before TensorFlow starts.

TensorFlow fixes its devices and its cluster when its runtime starts (the
first op, variable or model), so `import kerastower` settles both first
(`prepare_process`), once it has refused a ``$KERAS_BACKEND`` other than
TensorFlow or JAX, and only where the environment asks:

- ``$KERASTOWER_LOGICAL_DEVICES`` logical CPUs, which
  ``kerastower launch --towers`` sets for each worker
  (`kerastower.devices.configure_from_environment`);
- this process as a worker of the cluster that `TF_CONFIG` names, when it
  names two or more training workers
  (`kerastower.workers.multi_worker.prepare_workers`).

Without either variable, importing kerastower loads neither Keras nor
TensorFlow: the package's public names are imported when first used
(``kerastower/__init__.py``), so that the command line
(``kerastower launch``, ``--help``) starts at once. The same holds for every
program: what the import does depends on the environment only, never on
which program imports it.
"""

from __future__ import annotations

import os

from kerastower.workers import cluster
from kerastower.workers.configs import LOGICAL_DEVICES_VARIABLE


def on_jax() -> bool:
    """Whether kerastower runs on Keras 3's JAX backend (``KERAS_BACKEND=jax``)."""
    from kerastower import _installed_keras

    return _installed_keras.backend() == _installed_keras.JAX_BACKEND


def names_a_cluster() -> bool:
    """Whether `TF_CONFIG` makes this process one of several training workers.

    A malformed `TF_CONFIG` is not a cluster here: `worker_strategy` reports
    it when the script asks for the cluster.
    """
    try:
        return cluster.is_multi_worker()
    except ValueError:
        return False


def prepare_process() -> None:
    """Configures devices and the cluster worker from the environment.

    `kerastower/__init__.py` calls it first, once. TensorFlow is imported
    only when ``$KERASTOWER_LOGICAL_DEVICES`` is set or `TF_CONFIG` names a
    cluster (`names_a_cluster`).

    Raises:
        ImportError: If ``$KERAS_BACKEND`` sets Keras 3 to a backend other
            than TensorFlow or JAX.
        ValueError: If ``$KERASTOWER_LOGICAL_DEVICES`` is not an integer >= 1.
    """
    from kerastower import _installed_keras

    # Before TensorFlow, whose import imports Keras on that backend.
    _installed_keras.check_backend_variable()
    if on_jax():
        return  # JAX's devices are its own (`kerastower.on_jax`)
    if os.environ.get(LOGICAL_DEVICES_VARIABLE, "").strip():
        from kerastower import devices

        devices.configure_from_environment()
    if names_a_cluster():
        from kerastower.workers import multi_worker

        multi_worker.prepare_workers()
