"""Several workers: who this process is in a cluster, and starting the others.

- `cluster`: this process's place in `TF_CONFIG` (`is_chief`,
  `worker_index`, `shard`); public as `kerastower.cluster`.
- `multi_worker`: this process's `MultiWorkerMirroredStrategy`, made once
  (`worker_strategy`); public as `kerastower.multi_worker`.
- `evaluator`: `SidecarEvaluator`, the evaluator task; public as
  `kerastower.evaluator`.
- `launch`: `launch` and `launch_slurm_task`, behind ``kerastower launch``;
  public as `kerastower.launch`.
- `configs`: each launched worker's `TF_CONFIG`, ports and tower count.
- `group`: a group of worker processes: start, stream output, stop, wait.
- `heartbeats`: what each launched worker did last, for the launcher's report.
- `slurm`: a Slurm task's `TF_CONFIG` and GPUs, from ``srun``'s environment.
- `private_network`: a private network for local workers, loopback only.

Only `multi_worker` and `evaluator` import TensorFlow, so that the launcher
starts without it; this ``__init__`` imports none of them.
"""
