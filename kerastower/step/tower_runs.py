"""Running one step's tower function on every tower, and combining.

`TowerRuns.split_run` cuts the global batch into shards, weighs each tower
by its share ``n_i / B``, runs the towers under what they trace with
(`kerastower.step.tower_context`) and combines their results; a batch
smaller than the tower count runs whole on the first tower. The towers are
one function traced once and called on every device
(`kerastower.step.traced_towers`) where the settings allow, else one copy
traced per tower inside `tf.distribute.Strategy.run` (`run_copies`).
"""

from __future__ import annotations

import contextlib
import warnings

import tensorflow as tf

from kerastower import _keras_compat
from kerastower.reduce import keys, workers
from kerastower.reduce.towers import TowerSum
from kerastower.step import checks, layer_updates, traced_towers
from kerastower.step.plan import TRACED_ONCE, StepPlan
from kerastower.step.shards import first_leaf, local_results, tower_shards
from kerastower.step.tower_context import tower_context
from kerastower.workers import multi_worker


class TowerRuns:
    """Runs the tower functions of one `TowerModel`'s steps.

    Args:
        model: The `kerastower.TowerModel`.
        loss: Its `kerastower.step.step_loss.StepLoss`.
    """

    def __init__(self, model, loss):
        self.model = model
        self.loss = loss

    def split_run(self, tower_fn, combine, data, plan: StepPlan, state):
        """Runs `tower_fn(shard, weight, losses)` per tower and combines.

        The towers run as `plan` says: one function traced once, or copies.
        `state` is the step's `kerastower.step.layer_updates.StepState`.

        `combine` turns the list of per-tower outputs into the step's result.
        Returns that result and the global batch size ``B``, as float32.

        Each tower's weight is its share ``n_i / B`` of the global batch: of
        all the plan's workers' batches (one worker's for `predict`, which
        needs no weight and must not wait for the other workers). A batch
        smaller than the number of towers would leave towers without an
        example, which some TensorFlow kernels mishandle (oneDNN convolutions
        return a wrongly shaped empty tensor), so it runs whole on the first
        tower instead, as on one device: with copies, one device's
        own trace (there without XLA, which compiles the towers' ops only);
        with the tower traced once, that function on the whole batch, whose
        statistics are sums over one tower (equal to float tolerance). With
        one tower under XLA the tower always runs: XLA would keep both
        whole-model branches.
        """
        model = self.model
        if model.num_towers > 1:
            checks.check_no_stateful_layers(model)
        if plan.workers > 1:
            checks.check_gathered_steps(model)
        batch = tf.shape(first_leaf(data))[0]
        num_workers = plan.workers
        offset, total = tf.constant(0, tf.int32), tf.cast(batch, tf.float32)
        if num_workers > 1:
            offset, total = workers.batches_over_workers(model, batch)
        # Both branches number their cross-worker sums from one block of keys.
        block = (
            keys.StepBlock(per_call=model.global_batch_loss)
            if num_workers > 1
            else None
        )

        def weighted_fn(shard, weight, losses):
            # A `Mean` of a batch scalar (a loss tracked in `compute_loss`)
            # counts each tower with its loss's weight, so that the towers
            # count the batch once, as one device does.
            with _keras_compat.scalar_means_weighted(weight, model):
                return tower_fn(shard, weight, losses)

        def new_sum():
            return TowerSum(
                num_workers, model.tower_devices[0], multi_worker.timeout(), block
            )

        def on_towers():
            return combine(
                self.run_copies(
                    weighted_fn, data, batch, total, new_sum(), plan.xla, offset
                )
            )

        one_tower_warnings: list = []

        def on_one_tower():
            weight = tf.cast(batch, tf.float64) / tf.cast(total, tf.float64)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                # One device's statistics are this tower's, unless workers
                # add theirs.
                sum_fn = new_sum()
                context = tower_context(
                    model, total, sum_fn, sync_batch_norm=num_workers > 1
                )
                # On several workers the loss of the whole batch needs every
                # worker's rows; on one, this tower holds them all.
                gathering = (
                    self.loss.gathering(tf.reshape(batch, [1]), sum_fn, offset, total)
                    if num_workers > 1
                    else contextlib.nullcontext()
                )
                with gathering, context as losses, tf.device(model.tower_devices[0]):
                    result = combine([weighted_fn(data, weight, losses)])
            one_tower_warnings.append(caught)
            return result

        # Copies trace the model once per tower, and so does the one-tower
        # branch: a warning raised by a layer would show once per tower. The
        # one-tower branch traces as one device does: show its warnings, or,
        # where only the towers ran (eager) or the tower is traced once,
        # each distinct one once.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if plan.towers == TRACED_ONCE:

                def traced_fn(shard, weight, sizes, replica_values):
                    sum_fn = new_sum()
                    context = tower_context(model, total, sum_fn, sync_batch_norm=True)
                    gathering = self.loss.gathering(sizes, sum_fn, offset, total)
                    state.replica_values = replica_values
                    try:
                        with gathering, context as losses:
                            result = weighted_fn(shard, weight, losses)
                    finally:
                        state.replica_values = None
                    return result, layer_updates.traced_values(state)

                replicas = plan.replicas
                replicated = None
                if replicas is not None and replicas.built:
                    replicated = [
                        replicas.replica_variables(i) for i in range(model.num_towers)
                    ]
                runs = traced_towers.run(
                    model, traced_fn, data, batch, total, replicated
                )

                def traced(run):
                    def branch():
                        per_tower = run()
                        layer_updates.apply_traced(
                            model, state, [updates for _, updates in per_tower]
                        )
                        return combine([result for result, _ in per_tower])

                    return branch

                result = tf.cond(
                    batch >= model.num_towers, traced(runs[0]), traced(runs[1])
                )
            elif plan.xla and model.num_towers == 1:
                # One tower on several workers: the whole step is one XLA
                # computation, in which both branches ran the bench convnet's
                # step 4x slower (55 ms against 14 ms).
                result = on_towers()
            else:
                result = tf.cond(batch >= model.num_towers, on_towers, on_one_tower)
        _keras_compat.warn_once(
            one_tower_warnings[0] if one_tower_warnings else caught,
            _keras_compat.warnings_shown_at_build(model),
        )
        return result, total

    def run_copies(self, tower_fn, data, batch, total, sum_fn, xla, offset=0):
        """Splits `data` into shards and runs `tower_fn` on every tower (with
        `xla`, each compiled by XLA)."""
        sizes, weights, shards = tower_shards(data, batch, total, self.model.num_towers)
        strategy = self.model.tower_strategy
        inputs = strategy.experimental_distribute_values_from_function(
            lambda ctx: (
                shards[ctx.replica_id_in_sync_group],
                weights[ctx.replica_id_in_sync_group],
            )
        )
        context = tower_context(self.model, total, sum_fn, sync_batch_norm=True)
        gathering = self.loss.gathering(sizes, sum_fn, offset, total)
        compiled = contextlib.nullcontext()
        if xla:
            compiled = _keras_compat.compiled_in_towers(strategy)  # XLA per tower
        with gathering, context as losses, compiled:
            outputs = strategy.run(
                lambda args: tower_fn(args[0], args[1], losses), args=(inputs,)
            )
        return local_results(strategy, outputs)
