"""kerastower: train one Keras model on several devices, exactly."""

# ruff: noqa: E402 - the command line quiets TensorFlow before TensorFlow loads.
from kerastower.cli import quiet_start

quiet_start()

from importlib.metadata import PackageNotFoundError, version

from kerastower import callbacks, cluster, devices, multi_worker
from kerastower.cluster import is_chief, is_multi_worker, num_workers, worker_index
from kerastower.data import batch_for_towers
from kerastower.devices import available_devices, configure_logical_devices
from kerastower.model import TowerModel
from kerastower.multi_worker import worker_strategy
from kerastower.scaling import global_batch_size
from kerastower.splitting import split_sizes
from kerastower.strategy import TowerStrategy

# Before any TensorFlow work of the program: logical CPUs asked for by
# `kerastower launch --towers`, and the cluster named by TF_CONFIG.
devices.configure_from_environment()
multi_worker.prepare_workers()

try:
    __version__ = version("kerastower")
except PackageNotFoundError:  # pragma: no cover - source tree without install
    __version__ = "0.0.0"

__all__ = [
    "TowerModel",
    "TowerStrategy",
    "__version__",
    "available_devices",
    "batch_for_towers",
    "callbacks",
    "cluster",
    "configure_logical_devices",
    "global_batch_size",
    "is_chief",
    "is_multi_worker",
    "multi_worker",
    "num_workers",
    "split_sizes",
    "worker_index",
    "worker_strategy",
]
