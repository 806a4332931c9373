"""What `TowerModel`'s Keras entry points do before Keras's own.

- `fit` adds kerastower's callbacks around the user's: the launcher's
  heartbeat first; after the user's, the chief's broadcast of the weights on
  several workers, then the replicas' sync (`SyncReplicas`, so that both see
  what a `BackupAndRestore` or a resumed checkpoint restored).
- With replicas (``replicate_variables``), every other entry point
  (`evaluate`, `predict`, ``*_on_batch``) first copies the model's weights to
  the replicas the towers read: a weight assigned directly
  (``layer.kernel.assign``, ``layer.set_weights``) would otherwise reach tower
  0 only. `fit` copies the optimizer's state too. `set_weights` and
  `load_weights` copy them at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from kerastower._keras_compat.family import keras
from kerastower.reduce.replicas import Replicas
from kerastower.reduce.workers import BroadcastFromChief
from kerastower.step import checks, coupled_loss
from kerastower.workers import heartbeats

if TYPE_CHECKING:
    from kerastower.step.tower_step import TowerStep


class EntryPoints:
    """`TowerModel`'s overrides of `keras.Model`'s entry points.

    Mixed into `TowerModel` before `keras.Model`; reads the model's
    ``_tower_step``.
    """

    # What the model that mixes this in provides (`TowerModel`).
    _tower_step: TowerStep
    _tower_train_step: Callable

    def _copy_to_replicas(self) -> None:
        replicas = self._tower_step.replicas
        if replicas is not None:
            replicas.copy_weights(self.trainable_weights)

    def fit(self, *args, **kwargs):
        checks.check_not_distributed(args, kwargs, ("x", "validation_data"))
        ours = [BroadcastFromChief()] if self.num_workers > 1 else []
        replicas = self._tower_step.replicas
        if replicas is not None:
            builtin = type(self).train_step is self._tower_train_step
            user = kwargs.get("callbacks") or []
            each_batch = any(_may_assign(c, _BATCH_BEGIN) for c in user)
            first_epoch = any(_may_assign(c, _EPOCH_BEGIN) for c in user)
            ours.append(SyncReplicas(replicas, builtin, each_batch, first_epoch))
        # The launcher's heartbeat goes first, before the user's may hang.
        first = list(filter(None, [heartbeats.heartbeat_callback()]))
        if ours or first:
            user = list(kwargs.pop("callbacks", None) or [])
            kwargs["callbacks"] = first + user + ours
        try:
            return super().fit(*args, **kwargs)
        except BaseException as error:
            # Keras skips `on_train_end` when `fit` stops with an error: undo
            # `GradientAccumulation`'s step, or the next `fit` would
            # accumulate into a window nothing applies.
            if self.gradient_accumulator is not None:
                self.gradient_accumulator = None
            coupled_loss.raise_if_coupled(error)
            raise

    def evaluate(self, *args: Any, **kwargs: Any):
        checks.check_not_distributed(args, kwargs, ("x",))
        self._copy_to_replicas()
        return super().evaluate(*args, **self._with_replica_reads(kwargs))

    def predict(self, *args: Any, **kwargs: Any):
        checks.check_not_distributed(args, kwargs, ("x",))
        self._copy_to_replicas()
        return super().predict(*args, **self._with_replica_reads(kwargs))

    def _with_replica_reads(self, kwargs: dict) -> dict:
        """`kwargs` with `ReplicaReads` after the user's callbacks (a list;
        `fit`'s own list, for validation, holds `SyncReplicas`)."""
        replicas = self._tower_step.replicas
        callbacks = kwargs.get("callbacks")
        if replicas is None or isinstance(callbacks, keras.callbacks.CallbackList):
            return kwargs
        return kwargs | {"callbacks": [*(callbacks or []), ReplicaReads(replicas)]}

    def train_on_batch(self, *args: Any, **kwargs: Any):
        self._copy_to_replicas()
        replicas = self._tower_step.replicas
        if replicas is not None and self.built and self.optimizer is not None:
            # Made before the step traces: variables made in a trace would
            # make the step function trace a second time.
            if type(self).train_step is self._tower_train_step:
                checks.check_no_overwritten_gradients(self, self.trainable_weights)
                replicas.ensure(self.trainable_weights, self.optimizer)
        try:
            return super().train_on_batch(*args, **kwargs)
        except tf.errors.InvalidArgumentError as error:
            coupled_loss.raise_if_coupled(error)
            raise

    def test_on_batch(self, *args: Any, **kwargs: Any):
        self._copy_to_replicas()
        return super().test_on_batch(*args, **kwargs)

    def predict_on_batch(self, *args: Any, **kwargs: Any):
        self._copy_to_replicas()
        return super().predict_on_batch(*args, **kwargs)

    def set_weights(self, weights) -> None:
        super().set_weights(weights)
        self._copy_to_replicas()

    def load_weights(self, *args: Any, **kwargs: Any):
        result = super().load_weights(*args, **kwargs)
        # The optimizer's state too: a `.keras` file restores it.
        if self._tower_step.replicas is not None:
            self._tower_step.replicas.sync()
        return result


class ReplicaReads(keras.callbacks.Callback):
    """Copies the model's weights to its replicas as evaluation and
    prediction begin and end, after the user's callbacks.

    A callback may change the weights there (`SwapEMAWeights` swaps the
    moving averages in as `evaluate` begins and back as it ends): every tower
    then evaluates what the first one does, and training goes on from the
    weights the callbacks restored.

    Args:
        replicas: The model's `Replicas`.
    """

    def __init__(self, replicas: Replicas):
        super().__init__()
        self.replicas = replicas

    def _copy(self, logs=None):
        self.replicas.copy_weights(self.model.trainable_weights)

    on_test_begin = on_test_end = on_predict_begin = on_predict_end = _copy


class SyncReplicas(ReplicaReads):
    """Makes and syncs a `TowerModel`'s replicas when `fit` begins, and
    copies the weights to them around its validation (`ReplicaReads`).

    `TowerModel.fit` adds it after the user's callbacks, so it sees weights
    that theirs restored (`BackupAndRestore`, a resumed checkpoint) or
    swapped in for validation.

    Args:
        replicas: The model's `Replicas`.
        builtin_step: Whether the model trains with `TowerModel`'s own
            ``train_step``, whose optimizer the replicas clone. A
            ``train_step`` of the user's applies its gradients itself, to
            the model's variables: its replicas are made without clones and
            refreshed in each step (`kerastower.step.custom_step`).
        each_batch: Whether to copy the weights as every training batch
            begins, after the user's callbacks, for one that may assign
            them there (`_may_assign`); else as every epoch begins only.
        first_epoch: Whether to copy them as the first epoch begins too,
            for a callback that may assign them there. Else the replicas
            synced as `fit` began hold them already (ResNet50's 7 x 214
            copies on 8 towers: 0.16 s of the first step).
    """

    def __init__(
        self,
        replicas: Replicas,
        builtin_step: bool = True,
        each_batch: bool = False,
        first_epoch: bool = True,
    ):
        super().__init__(replicas)
        self.builtin_step = builtin_step
        self.each_batch = each_batch
        self.first_epoch = first_epoch
        self._synced = False

    def on_epoch_begin(self, epoch, logs=None):
        # After the first epoch, a callback's `on_epoch_end` may have
        # assigned the weights.
        if self.first_epoch or not self._synced:
            self._copy()
        self._synced = False

    def on_train_batch_begin(self, batch, logs=None):
        if self.each_batch:
            self._copy()

    def on_train_begin(self, logs=None):
        variables = self.model.trainable_weights
        checks.check_no_overwritten_gradients(self.model, variables)
        synced = False
        if variables and not self.builtin_step:
            synced = self.replicas.ensure(variables)
        elif variables and self.model.optimizer:
            synced = self.replicas.ensure(variables, self.model.optimizer)
        if not synced:
            self.replicas.sync()
        self._synced = True


# Callbacks of Keras's own that hook a batch's or an epoch's beginning
# without changing the weights (a learning rate is the optimizer's state,
# which the replicas' optimizers copy in every step).
_READS_ONLY = (
    keras.callbacks.TensorBoard,
    keras.callbacks.ProgbarLogger,
    keras.callbacks.History,
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.LearningRateScheduler,
)


_BATCH_BEGIN = ("on_train_batch_begin", "on_batch_begin")
_EPOCH_BEGIN = ("on_epoch_begin",)


def _may_assign(callback: keras.callbacks.Callback, hooks: tuple[str, ...]) -> bool:
    """Whether a user's callback has one of `hooks` (``on_epoch_begin``,
    say) of its own, where it may assign the weights: then the replicas
    copy them there, after it, as tower 0 reads them."""
    if type(callback) in _READS_ONLY:  # a subclass may assign
        return False
    if type(callback).__module__.startswith("kerastower."):
        return False  # kerastower's callbacks assign no weight there
    base = keras.callbacks.Callback
    return any(
        name in vars(callback)
        or getattr(type(callback), name) is not getattr(base, name)
        for name in hooks
    )
