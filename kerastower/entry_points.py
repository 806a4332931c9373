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

import warnings
from typing import Any

import keras

from kerastower import heartbeats
from kerastower.reduce.replicas import Replicas
from kerastower.reduce.workers import BroadcastFromChief


class EntryPoints:
    """`TowerModel`'s overrides of `keras.Model`'s entry points.

    Mixed into `TowerModel` before `keras.Model`; reads the model's
    ``_tower_step``.
    """

    def _copy_to_replicas(self) -> None:
        replicas = self._tower_step.replicas
        if replicas is not None:
            replicas.copy_weights(self.trainable_weights)

    def fit(self, *args, **kwargs):
        ours = [BroadcastFromChief()] if self.num_workers > 1 else []
        replicas = self._tower_step.replicas
        if replicas is not None:
            ours += sync_callbacks(
                replicas,
                type(self).train_step is self._tower_train_step,
                warn=self.replicate_variables is True,
            )
        # The launcher's heartbeat goes first, before the user's may hang.
        first = list(filter(None, [heartbeats.heartbeat_callback()]))
        if ours or first:
            user = list(kwargs.pop("callbacks", None) or [])
            kwargs["callbacks"] = first + user + ours
        try:
            return super().fit(*args, **kwargs)
        except BaseException:
            # Keras skips `on_train_end` when `fit` stops with an error: undo
            # `GradientAccumulation`'s step, or the next `fit` would
            # accumulate into a window nothing applies.
            if self.gradient_accumulator is not None:
                self.gradient_accumulator = None
            raise

    def evaluate(self, *args: Any, **kwargs: Any):
        self._copy_to_replicas()
        return super().evaluate(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any):
        self._copy_to_replicas()
        return super().predict(*args, **kwargs)

    def train_on_batch(self, *args: Any, **kwargs: Any):
        self._copy_to_replicas()
        return super().train_on_batch(*args, **kwargs)

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


class SyncReplicas(keras.callbacks.Callback):
    """Makes and syncs a `TowerModel`'s replicas when `fit` begins.

    `TowerModel.fit` adds it after the user's callbacks, so it sees weights
    that theirs restored (`BackupAndRestore`, a resumed checkpoint).

    Args:
        replicas: The model's `Replicas`.
        make: Whether to make the replicas if there are none yet; otherwise
            only replicas that a step made are synced.
    """

    def __init__(self, replicas: Replicas, make: bool = True):
        super().__init__()
        self.replicas = replicas
        self.make = make

    def on_train_begin(self, logs=None):
        if self.make and self.model.trainable_weights and self.model.optimizer:
            self.replicas.ensure(self.model.trainable_weights, self.model.optimizer)
        self.replicas.sync()


def sync_callbacks(replicas: Replicas, builtin_step: bool, warn: bool = True) -> list:
    """The callbacks `TowerModel.fit` adds for `replicas`.

    Args:
        replicas: The model's `Replicas`.
        builtin_step: Whether the model trains with `TowerModel`'s own
            ``train_step``. A ``train_step`` of the user's that applies its
            gradients itself does so to the model's variables only: the
            towers then read those (exactly, as without replicas). Replicas
            that its call of ``super().train_step`` made are still synced.
        warn: Whether to warn that a step of the user's trains without
            replicas (``replicate_variables=True``; not for ``"auto"``).

    Returns:
        ``[SyncReplicas(replicas)]``, which makes the replicas only for the
        built-in step.
    """
    if not builtin_step and warn:
        warnings.warn(
            "`replicate_variables=True` has no effect on a model with its own "
            "`train_step`: the step applies its gradients to the model's "
            "variables only, so every tower reads those, as without replicas "
            "(the training is exact, with the traffic of "
            "`replicate_variables=False`).",
            stacklevel=3,
        )
    return [SyncReplicas(replicas, make=builtin_step)]
