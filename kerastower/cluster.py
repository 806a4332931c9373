"""Who this process is in a multi-worker cluster, read from `TF_CONFIG`.

`TF_CONFIG` is the JSON environment variable that TensorFlow's multi-worker
strategies read:

```json
{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
 "task": {"type": "worker", "index": 0}}
```

The training workers are the ``"chief"`` task (at most one) and the
``"worker"`` tasks. An ``"evaluator"`` task (at most one) trains nothing: it
evaluates the checkpoints that training writes (`kerastower.evaluator`), and
is neither counted among the workers nor multi-worker itself. The workers'
global index puts the chief first: with a chief, chief -> 0 and worker ``i``
-> ``i + 1``; without one, worker ``i`` -> ``i``.
The chief is the ``"chief"`` task, or worker 0 when the cluster has none; it is
the one process that writes checkpoints and logs. Without `TF_CONFIG` (or with
an empty one) the process is a single worker, index 0, and the chief.

Everything here is plain Python: `parse_tf_config` and the `*_of` functions
work on a given config, the others read the environment each time they are
called, so changing `TF_CONFIG` (as tests do) takes effect at once.
"""

# The code is in kerastower/workers/cluster.py; this module hands on its
# public names under the path they have always had.
from kerastower.workers.cluster import (
    EVALUATOR,
    TRAINING_TASK_TYPES,
    is_chief,
    is_chief_of,
    is_evaluator,
    is_multi_worker,
    num_workers,
    num_workers_of,
    parse_tf_config,
    shard,
    tf_config,
    worker_index,
    worker_index_of,
)

__all__ = [
    "TRAINING_TASK_TYPES",
    "EVALUATOR",
    "parse_tf_config",
    "tf_config",
    "num_workers_of",
    "worker_index_of",
    "is_chief_of",
    "num_workers",
    "worker_index",
    "is_multi_worker",
    "is_evaluator",
    "is_chief",
    "shard",
]
