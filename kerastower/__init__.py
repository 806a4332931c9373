"""kerastower: train one Keras model on several devices, exactly."""

from importlib.metadata import PackageNotFoundError, version

from kerastower import _startup

_startup.prepare_process()

try:
    __version__ = version("kerastower")
except PackageNotFoundError:  # pragma: no cover - source tree without install
    __version__ = "0.0.0"

__all__ = [
    "AllReduceOptions",
    "KerasCompatibilityError",
    "TowerModel",
    "TowerStrategy",
    "__version__",
    "available_devices",
    "batch_for_towers",
    "callbacks",
    "cluster",
    "configure_logical_devices",
    "evaluator",
    "global_batch_size",
    "is_chief",
    "is_multi_worker",
    "multi_worker",
    "num_workers",
    "split_sizes",
    "testing",
    "worker_index",
    "worker_strategy",
]

# What the TensorFlow backend has and the JAX one does not (yet).
_TENSORFLOW_ONLY = [
    name
    for name in __all__
    if name not in ("KerasCompatibilityError", "TowerModel", "__version__")
]

# The command line imports what each subcommand needs itself (see `_startup`).
if _startup.started_as_command():
    pass
elif _startup.on_jax():
    from kerastower._errors import KerasCompatibilityError
    from kerastower._keras_compat import jax as _jax_fence  # noqa: F401 - first: says what is missing
    from kerastower.on_jax import TowerModel

    __all__ = ["KerasCompatibilityError", "TowerModel", "__version__"]

    def __getattr__(name: str):
        if name in _TENSORFLOW_ONLY:
            raise AttributeError(
                f"`kerastower.{name}` runs on Keras's TensorFlow backend, and "
                "Keras runs on JAX here (KERAS_BACKEND=jax): on JAX, kerastower "
                "has `TowerModel` (https://kerastower.github.io/kerastower/"
                "guides/jax/)."
            )
        raise AttributeError(f"module 'kerastower' has no attribute {name!r}")
else:
    from kerastower import callbacks, cluster, evaluator, multi_worker, testing
    from kerastower._errors import KerasCompatibilityError
    from kerastower.data import batch_for_towers
    from kerastower.devices import available_devices, configure_logical_devices
    from kerastower.model import TowerModel
    from kerastower.reduce.ring import AllReduceOptions
    from kerastower.scaling import global_batch_size
    from kerastower.step.shards import split_sizes
    from kerastower.strategy import TowerStrategy
    from kerastower.workers.cluster import (
        is_chief,
        is_multi_worker,
        num_workers,
        worker_index,
    )
    from kerastower.workers.multi_worker import worker_strategy
