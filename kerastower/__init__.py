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

# The command line imports what each subcommand needs itself (see `_startup`).
if not _startup.started_as_command():
    from kerastower import callbacks, cluster, evaluator, multi_worker, testing
    from kerastower._keras_compat.errors import KerasCompatibilityError
    from kerastower.cluster import is_chief, is_multi_worker, num_workers, worker_index
    from kerastower.data import batch_for_towers
    from kerastower.devices import available_devices, configure_logical_devices
    from kerastower.model import TowerModel
    from kerastower.multi_worker import worker_strategy
    from kerastower.reduce.ring import AllReduceOptions
    from kerastower.scaling import global_batch_size
    from kerastower.step.shards import split_sizes
    from kerastower.strategy import TowerStrategy
