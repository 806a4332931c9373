"""kerastower: train one Keras model on several devices, exactly.

Importing kerastower sets up the logical CPUs and the cluster worker that
the environment asks for (``$KERASTOWER_LOGICAL_DEVICES``, `TF_CONFIG`), and
imports each public name when it is first used: ``import kerastower`` alone
loads no TensorFlow, ``from kerastower import TowerModel`` does.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from kerastower import _startup

_startup.prepare_process()

try:
    __version__ = version("kerastower")
except PackageNotFoundError:  # pragma: no cover - source tree without install
    __version__ = "0.0.0"

# Each public name, and the module it is imported from on first use (a
# subpackage's own name: the subpackage).
_TENSORFLOW_NAMES = {
    "AllReduceOptions": "kerastower.reduce.ring",
    "KerasCompatibilityError": "kerastower._errors",
    "TowerModel": "kerastower.model",
    "TowerStrategy": "kerastower.strategy",
    "available_devices": "kerastower.devices",
    "batch_for_towers": "kerastower.data",
    "callbacks": "kerastower.callbacks",
    "cluster": "kerastower.cluster",
    "configure_logical_devices": "kerastower.devices",
    "evaluator": "kerastower.evaluator",
    "global_batch_size": "kerastower.scaling",
    "is_chief": "kerastower.workers.cluster",
    "is_multi_worker": "kerastower.workers.cluster",
    "multi_worker": "kerastower.multi_worker",
    "num_workers": "kerastower.workers.cluster",
    "split_sizes": "kerastower.step.shards",
    "testing": "kerastower.testing",
    "worker_index": "kerastower.workers.cluster",
    "worker_strategy": "kerastower.workers.multi_worker",
}
# What kerastower has on Keras 3's JAX backend (`kerastower.on_jax`).
_JAX_NAMES = {
    "KerasCompatibilityError": "kerastower._errors",
    "TowerModel": "kerastower.on_jax",
}

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
_NAMES = _TENSORFLOW_NAMES
if _startup.on_jax():
    _NAMES = _JAX_NAMES
    __all__ = ["KerasCompatibilityError", "TowerModel", "__version__"]


def __getattr__(name: str):
    module_name = _NAMES.get(name)
    if module_name is None:
        if name in _TENSORFLOW_NAMES:
            raise AttributeError(
                f"`kerastower.{name}` runs on Keras's TensorFlow backend, and "
                "Keras runs on JAX here (KERAS_BACKEND=jax): on JAX, kerastower "
                "has `TowerModel` (https://kerastower.github.io/kerastower/"
                "guides/jax/)."
            )
        raise AttributeError(f"module 'kerastower' has no attribute {name!r}")
    if _NAMES is _JAX_NAMES:
        importlib.import_module("kerastower._jax_compat")  # first: says what is missing
    module = importlib.import_module(module_name)
    value = module if module_name == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what static tools (type checkers, the API pages) read
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
