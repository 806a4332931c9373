"""Running one step's tower body on every tower, and combining.

`TowerRuns.split_run` cuts the global batch into shards, weighs each tower
by its share ``n_i / B``, runs a step's tower body
(`kerastower.step.tower_body`) on each under what the towers trace with
(`kerastower.step.tower_context.TowerFrame`) and has the body combine their
results; a batch smaller than the tower count runs whole on the first
tower. The towers are
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
from kerastower.step import checks, tower_body, traced_towers
from kerastower.step.plan import TRACED_ONCE, StepPlan
from kerastower.step.shards import (
    even_shard,
    first_leaf,
    local_results,
    tower_shards,
)
from kerastower.step.tower_context import TowerFrame


def _joined(body, run, combine, first_tower=0):
    """A branch that makes the assignments of the towers' ``(result,
    updates)`` that `run()` returns, from `first_tower` on, and `combine`s
    their results."""

    def branch():
        per_tower = run()
        updates = [updates for _, updates in per_tower[first_tower:]]
        body.apply_updates(updates, first_tower=first_tower)
        return combine([result for result, _ in per_tower])

    return branch


class TowerRuns:
    """Runs the towers of one `TowerModel`'s steps.

    Args:
        model: The `kerastower.TowerModel`.
        loss: Its `kerastower.step.step_loss.StepLoss`.
    """

    def __init__(self, model, loss):
        self.model = model
        self.loss = loss

    def split_run(self, body, data, plan: StepPlan):
        """Runs `body` on every tower's shard of `data` and combines.

        `body` is a `kerastower.step.tower_body.TowerBody`: each tower
        returns ``body(shard, weight, losses)`` and the step's result is
        ``body.combine(per_tower)``. The towers run as `plan` says: one
        function traced once, or copies.

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
        batch = tf.shape(first_leaf(data))[0]
        num_workers = plan.workers
        offset, total = tf.constant(0, tf.int32), tf.cast(batch, tf.float32)
        block = calls = None
        if num_workers > 1:
            every = workers.worker_batches(model, batch)
            offset, total = workers.batches_over_workers(model, every)
            if plan.towers == TRACED_ONCE:
                # The calls' collectives span every worker's towers: the
                # towers' sums need no move over the workers of their own.
                calls = keys.calls_group(*tf.unstack(tf.cast(every, tf.int32)))
                num_workers = 1
            else:
                # Both branches number their sums over the workers from one
                # block of keys.
                gathered = tf.cast(total, tf.int32) if model.global_batch_loss else None
                block = keys.StepBlock(num_workers, gathered)
        frame = TowerFrame(model, self.loss, total, offset, num_workers, block)

        def on_towers():
            return body.combine(
                self.run_copies(body, frame, data, batch, total, plan.xla)
            )

        one_tower_warnings: list = []

        def on_one_tower():
            weight = tf.cast(batch, tf.float64) / tf.cast(total, tf.float64)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with frame.one_tower(batch) as losses:
                    with tf.device(model.tower_devices[0]):
                        result = body.combine([frame.call(body, data, weight, losses)])
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
                replicas = plan.replicas
                if replicas is not None and not replicas.built:
                    replicas = None
                # With replicas on one worker, the towers sum their dense
                # gradients inside the traced tower, over every tower.
                sums_gradients = (
                    replicas is not None
                    and calls is None
                    and isinstance(body, tower_body.Gradients)
                )
                if sums_gradients:
                    body.summed_inside = True
                runs = traced_towers.run(
                    model,
                    body,
                    frame,
                    data,
                    batch,
                    total,
                    replicas,
                    calls,
                    sums_gradients,
                )
                # Every tower is called at every step on one worker where
                # towers return what they assign (Keras 3): where layers
                # assign inside a tower (Keras 2), every tower running a
                # small batch as the first does would assign as it does.
                # Over several workers, a call's group counts the towers of
                # every worker that run. A cond calls the others, where the
                # batch may be small: a batch that splits evenly never is.
                every = calls is None and not _keras_compat.assigns_in_towers()
                if every or runs.even:
                    result = self._every_tower(body, runs, batch)
                else:
                    result = tf.cond(
                        batch >= model.num_towers,
                        _joined(body, runs.on_towers, body.combine),
                        _joined(body, runs.on_one_tower, body.combine),
                    )
            elif plan.xla and model.num_towers == 1:
                # One tower on several workers: the whole step is one XLA
                # computation, in which both branches ran the bench convnet's
                # step 4x slower (55 ms against 14 ms).
                result = on_towers()
            elif plan.workers == 1 and even_shard(data, model.num_towers):
                # Never smaller than the tower count. (Over several workers,
                # each traces both branches, whose keys every worker counts.)
                result = on_towers()
            else:
                result = tf.cond(batch >= model.num_towers, on_towers, on_one_tower)
        _keras_compat.warn_once(
            one_tower_warnings[0] if one_tower_warnings else caught,
            plan.shown_warnings,
        )
        return result, total

    def _every_tower(self, body, runs, batch):
        """`body`'s result from `traced_towers.Runs.on_every_tower`.

        The first tower's assignments are made in any case; the other
        towers' results but their gradients, and their assignments, join
        the first's in a `tf.cond` on whether the first ran the batch whole
        (when it did, they are left out), or, where the batch splits evenly
        (`Runs.even`), never does, without it. The gradients and the first
        tower's assignments stay out of it, where each would be an input
        and an output of both branches (`Gradients.combine_gradients`).
        """
        towers = self.model.num_towers
        small = None if runs.even else batch < towers
        per_tower = runs.on_every_tower(small)
        body.apply_updates([per_tower[0][1]])
        gradients = isinstance(body, tower_body.Gradients)
        combine = body.combine_rest if gradients else body.combine

        def joined(count):
            return _joined(body, lambda: per_tower[:count], combine, first_tower=1)

        if small is None:
            rest = joined(towers)()
        else:
            rest = tf.cond(small, joined(1), joined(towers))
        if not gradients:
            return rest
        grads = [result[0] for result, _ in per_tower]
        return (body.combine_gradients(grads, small), *rest)

    def run_copies(self, body, frame, data, batch, total, xla):
        """Splits `data` into shards and runs `body` on every tower, in
        `frame` (with `xla`, each tower compiled by XLA)."""
        sizes, weights, shards, _ = tower_shards(
            data, batch, total, self.model.num_towers
        )
        strategy = self.model.tower_strategy
        inputs = strategy.experimental_distribute_values_from_function(
            lambda ctx: (
                shards[ctx.replica_id_in_sync_group],
                weights[ctx.replica_id_in_sync_group],
            )
        )
        compiled = contextlib.nullcontext()
        if xla:
            compiled = _keras_compat.compiled_in_towers(strategy)  # XLA per tower
        with frame.towers(sizes) as losses, compiled:
            outputs = strategy.run(
                lambda args: frame.call(body, args[0], args[1], losses), args=(inputs,)
            )
        return local_results(strategy, outputs)
