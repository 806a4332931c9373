"""Collectives over one worker's tower devices, each tower a member.

The all-reduce and all-gather that keep `kerastower.reduce.replicas` equal:
one ``CollectiveReduceV2`` or ``CollectiveGatherV2`` op per tower, on its
device (a ring on CPUs, NCCL on GPUs with ``communication_hint="auto"``).
Every member receives the same bytes: the ring's last phase copies each
reduced or gathered chunk, so the towers' results are bitwise identical.

A ring all-reduce of ``G`` bytes moves ``2 (N-1)/N * G`` bytes in and out of
each of ``N`` devices; an all-gather of ``R`` bytes in all, ``(N-1)/N * R``.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from kerastower.reduce import keys


def pack(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Flattens `tensors` (one dtype) into one vector, in order."""
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def unpack(flat: tf.Tensor, shapes: Sequence[tf.TensorShape]) -> list[tf.Tensor]:
    """Undoes `pack` for tensors of the given static `shapes`."""
    sizes = [shape.num_elements() for shape in shapes]
    return [
        tf.reshape(piece, shape)
        for piece, shape in zip(tf.split(flat, sizes, num=len(sizes)), shapes)
    ]


class Ring:
    """Collectives whose members are `devices`, one tensor per device.

    Args:
        devices: The members, tower 0 first.
        tokens: One resource variable per device that orders its collectives
            (as `tf.distribute.MirroredStrategy` does); without it,
            automatic control dependencies chain the towers' collectives,
            which then wait for each other.
    """

    def __init__(self, devices: Sequence[str], tokens: Sequence[tf.Variable]):
        self.devices = list(devices)
        self.tokens = list(tokens)

    def sum(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """``sum_i values[i]``, on every device; `values[i]` on device ``i``."""
        return self._launch(values, "reduce", keys.reserve())

    def gather_rows(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """Every device's rows, concatenated in device order, on every device.

        `values[i]` (on device ``i``) may have any number ``n_i`` of rows;
        the rest of its shape is the same on every device. The row counts are
        gathered first, each member's rows are padded to the largest count
        for the gather (which needs equal shapes), and the padding is cut
        off, as `tf.distribute`'s all-gather does.
        """
        counts = []
        for device, value in zip(self.devices, values):
            with tf.device(device):
                counts.append(tf.shape(value, out_type=tf.int64)[:1])
        per_device = self._launch(counts, "gather", keys.reserve())
        out = []
        for device, value, sizes in zip(self.devices, values, per_device):
            with tf.device(device):
                longest = tf.reduce_max(sizes)
                pad = [[0, longest - tf.shape(value, out_type=tf.int64)[0]]]
                out.append(tf.pad(value, pad + [[0, 0]] * (value.shape.rank - 1)))
        # The padded shape changes with the batch: a new key at every run.
        gathered = self._launch(out, "gather", keys.run_key())
        rows = []
        for device, whole, sizes in zip(self.devices, gathered, per_device):
            with tf.device(device):
                longest = tf.reduce_max(sizes)
                pieces = [
                    whole[i * longest : i * longest + sizes[i]]
                    for i in range(len(self.devices))
                ]
                rows.append(tf.concat(pieces, axis=0))
        return rows

    def _launch(
        self, values: Sequence[tf.Tensor], kind: str, key: int | tf.Tensor
    ) -> list[tf.Tensor]:
        group = keys.group_key(self.devices)
        size = len(self.devices)

        def launch(values):
            out = []
            for device, value, token in zip(self.devices, values, self.tokens):
                with tf.device(device):
                    common = dict(
                        input=value,
                        group_size=size,
                        group_key=group,
                        instance_key=key,
                        ordering_token=[token.handle],
                        communication_hint="auto",
                    )
                    if kind == "reduce":
                        out.append(
                            tf.raw_ops.CollectiveReduceV2(
                                merge_op="Add", final_op="Id", **common
                            )
                        )
                    else:
                        out.append(tf.raw_ops.CollectiveGatherV2(**common))
            return out

        if tf.executing_eagerly():
            # Eagerly each collective would wait for the others in turn.
            return tf.function(launch)(list(values))
        return launch(list(values))
