"""One training, evaluation or prediction step over this worker's towers.

- `tower_step`: `TowerStep`, the step top to bottom (split, run the towers,
  sum, apply, update the metrics once).
- `custom_step`: `TowerModel.tower_gradients` for a `train_step` of the
  user's.
- `shards`: cutting the global batch into tower shards and gathering the
  outputs back (the split math as plain functions).
- `loss_weighting`: the rule that makes the towers' losses add up to one
  device's.
- `step_loss`: `StepLoss`, a tower's loss (of its shard, or of the gathered
  global batch with ``global_batch_loss``), added up over the towers.
- `tower_context`: what the towers trace under (weighted compiled losses,
  synchronised `BatchNormalization`).
- `batch_norm`: the global batch's moments for `BatchNormalization`.
- `layer_updates`: weights assigned in the forward pass, once per step.
- `checks`: what a model or optimizer must be to train on towers.

The sums it needs across towers, workers, replicas and micro-batches are in
`kerastower.reduce`.
"""
