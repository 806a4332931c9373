"""This process's place in a cluster: `MultiWorkerMirroredStrategy`, made once.

Within a worker, `TowerModel` splits its local batch over its local towers.
Across workers it sums with TensorFlow's collective ops, in the cluster that
`tf.distribute.MultiWorkerMirroredStrategy`, TensorFlow's own multi-worker
engine, sets up: the global batch size,
the gradients and the metric updates are summed over workers, so every worker
applies the same update to the same weights.

TensorFlow sets the cluster up at start-up only, so when `TF_CONFIG` names
several workers, importing kerastower prepares it (`prepare_workers`): the
script may then build its layers, models and data in any order, and the
strategy is made with the first `TowerModel` (or `worker_strategy`). See the
guide to several machines.
"""

# The code is in kerastower/workers/multi_worker.py; this module hands on its
# public names under the path they have always had.
from kerastower.workers.multi_worker import (
    DEFAULT_TIMEOUT_SECONDS,
    prepare_workers,
    timeout,
    worker_strategy,
)

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "prepare_workers",
    "worker_strategy",
    "timeout",
]
