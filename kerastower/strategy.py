"""The `tf.distribute` strategy that runs one model's towers."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


class TowerStrategy(tf.distribute.MirroredStrategy):
    """A `MirroredStrategy` whose replicas each see themselves as one device.

    Keras divides mean-reduced losses and regularization losses by
    ``tf.distribute.get_strategy().num_replicas_in_sync`` inside a replica, so
    that summing the replicas' losses gives the global loss when every replica
    holds the same number of examples. `TowerModel` instead weights each tower's
    loss by its exact share of the global batch, which is right for any split;
    for that it needs each tower's loss as one device would compute it, so this
    strategy reports ``num_replicas_in_sync == 1``. Cross-replica reductions
    (used by synchronised `BatchNormalization`) still span every tower.

    Args:
        devices: The tower devices, one replica each.
    """

    def __init__(self, devices: Sequence[str]):
        # Collective all-reduce keys clash between strategies in one process;
        # the cross-tower reductions here are small (BatchNormalization
        # statistics), so a plain reduction onto the first tower serves.
        super().__init__(
            devices=list(devices),
            cross_device_ops=tf.distribute.ReductionToOneDevice(
                reduce_to_device=devices[0]
            ),
        )

    @property
    def num_replicas_in_sync(self) -> int:
        return 1
