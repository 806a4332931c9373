"""Starting worker processes: the ``kerastower launch`` command.

``kerastower launch -n 2 --towers 2 train.py --epochs 3`` starts two local
workers, each ``python train.py --epochs 3`` with its own `TF_CONFIG` (free
ports on ``127.0.0.1``) and ``KERASTOWER_LOGICAL_DEVICES=2`` (the logical CPUs
kerastower makes on a machine without a GPU), and streams their output with
each line prefixed ``[worker i]``. The first failure stops the other workers
(with ``--max-restarts K``, then starts them all again, up to K times);
Ctrl-C reaches them as SIGTERM. ``kerastower launch --hosts a:2222,b:2222
--index 0`` starts nothing: it prints worker 0's `TF_CONFIG`. Under Slurm,
``srun kerastower launch --slurm train.py`` runs one worker per Slurm task,
with the `TF_CONFIG` that the task's environment gives (`launch_slurm_task`).
The launcher is plain Python: it neither imports TensorFlow nor joins the
cluster.
"""

# The code is in kerastower/workers/launch.py; this module hands on its
# public names under the path they have always had.
from kerastower.workers.launch import (
    LOOPBACK,
    free_loopback_ports,
    launch,
    launch_slurm_task,
    tf_config_for,
    towers_per_worker,
)

__all__ = [
    "LOOPBACK",
    "free_loopback_ports",
    "launch",
    "launch_slurm_task",
    "tf_config_for",
    "towers_per_worker",
]
