"""Every sum across towers, workers, replicas and micro-batches.

- `keys`: the one allocator of collective group and instance keys.
- `towers`: sums over the towers of a step, and over every tower of every
  worker from inside a step (`TowerSum`).
- `gradients`: one variable's per-tower gradients into the one-device
  gradient (dense added, sparse rows kept as one device has them).
- `workers`: sums, gathers and broadcasts across the workers of a
  `MultiWorkerMirroredStrategy`.
- `ring`: the ring's collectives over the towers (`Ring`,
  `AllReduceOptions`).
- `ring_gradients`: gradients all-reduced and weights broadcast through a
  `Ring`.
- `replica_setting`: whether a model's towers train on replicas.
- `replicas`: per-tower replicas of the variables, kept equal by a ring
  all-reduce of the gradients (``replicate_variables``).
- `accumulation`: micro-batch windows for exact gradient accumulation.
"""
