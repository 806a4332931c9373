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

import dataclasses
import functools
from collections.abc import Sequence

import tensorflow as tf

from kerastower.reduce import keys

COMPRESSIONS = (None, "float16", "bfloat16")


@dataclasses.dataclass(frozen=True)
class AllReduceOptions:
    """How `TowerModel`'s replicas all-reduce their dense gradients.

    With replicas (``replicate_variables``), the towers' dense gradients of
    one dtype are packed into buckets of at most `bucket_mb` megabytes
    (``2**20`` bytes) each, the last layers' first, as backpropagation
    makes them; each bucket is one ring all-reduce, which starts as soon as
    its gradients exist, while backpropagation goes on (as PyTorch's
    ``DistributedDataParallel`` buckets). A gradient larger than a bucket
    has a bucket of its own.

    Args:
        bucket_mb: The most megabytes of gradients in one all-reduce, a
            number > 0. Defaults to 25 (``DistributedDataParallel``'s
            ``bucket_cap_mb``).
        compression: ``None`` (the default, exact), ``"float16"`` or
            ``"bfloat16"``: float32 buckets are cast to that dtype for the
            all-reduce and back, which halves the bytes moved and rounds
            every tower's gradient and the sums to 11 (float16) or 8
            (bfloat16) significant bits, as Horovod's
            ``Compression.fp16`` does. The model then differs from one
            device's by that rounding (see the one-machine guide).

    Raises:
        ValueError: If `bucket_mb` is not a number > 0, or `compression` is
            not one of ``None``, ``"float16"`` and ``"bfloat16"``.
    """

    bucket_mb: float = 25.0
    compression: str | None = None

    def __post_init__(self):
        if isinstance(self.bucket_mb, bool) or not (
            isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0
        ):
            raise ValueError(
                "`bucket_mb` must be a number > 0. "
                f"Received: bucket_mb={self.bucket_mb!r}"
            )
        if self.compression not in COMPRESSIONS:
            raise ValueError(
                "`compression` must be None, 'float16' or 'bfloat16'. "
                f"Received: compression={self.compression!r}"
            )

    @property
    def bucket_bytes(self) -> int:
        """`bucket_mb` in bytes."""
        return max(1, int(self.bucket_mb * 2**20))


def buckets(sizes: Sequence[int], cap: int) -> list[list[int]]:
    """Groups tensors of `sizes` bytes into buckets of at most `cap` bytes.

    The last tensor comes first (backpropagation makes the last layers'
    gradients first) and consecutive tensors share a bucket while it holds
    at most `cap` bytes; a tensor larger than `cap` is a bucket alone.

    Returns:
        The indices into `sizes` of each bucket, in ascending order within a
        bucket; the buckets in the order they fill.
    """
    out: list[list[int]] = []
    used = 0
    for index in reversed(range(len(sizes))):
        if out and used + sizes[index] <= cap:
            out[-1].insert(0, index)
            used += sizes[index]
        else:
            out.append([index])
            used = sizes[index]
    return out


def wire_dtype(options: AllReduceOptions, dtype: tf.DType) -> tf.DType:
    """The dtype that tensors of `dtype` are all-reduced in under `options`:
    float32 ones in the compression's, if any; others in their own."""
    if options.compression and dtype == tf.float32:
        return tf.as_dtype(options.compression)
    return dtype


def dtype_buckets(
    options: AllReduceOptions, shapes: Sequence[tf.TensorShape], dtype: tf.DType
) -> list[list[int]]:
    """`buckets` of tensors of `shapes` and `dtype`, of at most
    ``options.bucket_bytes`` each."""
    sizes = [shape.num_elements() * dtype.size for shape in shapes]
    return buckets(sizes, options.bucket_bytes)


def pack(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Flattens `tensors` (one dtype) into one vector, in order."""
    # One shape constant for all (`tf.reshape` makes one each): the first
    # step traces a bucket of every gradient (ResNet50: 214).
    flat = tf.constant([-1])
    return tf.concat([tf.raw_ops.Reshape(tensor=t, shape=flat) for t in tensors], 0)


def unpack(flat: tf.Tensor, shapes: Sequence[tf.TensorShape]) -> list[tf.Tensor]:
    """Undoes `pack` for tensors of the given static `shapes`."""
    sizes = [shape.num_elements() for shape in shapes]
    constants: dict[tuple, tf.Tensor] = {}  # one per distinct shape
    out = []
    for piece, shape in zip(tf.split(flat, sizes, num=len(sizes)), shapes):
        dims = tuple(shape.as_list())
        if dims not in constants:
            constants[dims] = tf.constant(dims, tf.int32, shape=[len(dims)])
        piece = tf.raw_ops.Reshape(tensor=piece, shape=constants[dims])
        piece.set_shape(shape)
        out.append(piece)
    return out


@functools.lru_cache(maxsize=256)
def _traced(unpacks: bool, shapes: tuple, dtype: tf.DType, wire: tf.DType):
    """`pack` (cast to `wire`) or `unpack` (cast back) of `shapes`, traced once.

    Every tower calls the one function on its device: a step traces its
    buckets' reshapes once, not once per tower. The calls are inlined when
    the step runs, so the step's graph is the same.
    """
    shapes = [tf.TensorShape(s) for s in shapes]
    if unpacks:
        size = sum(s.num_elements() for s in shapes)
        function = tf.function(
            lambda flat: unpack(tf.cast(flat, dtype), shapes), autograph=False
        )
        specs = [tf.TensorSpec([size], wire)]
    else:
        function = tf.function(lambda ts: tf.cast(pack(ts), wire), autograph=False)
        specs = [[tf.TensorSpec(s, dtype) for s in shapes]]
    with tf.init_scope():  # apart from the step, on no device: the caller's
        return function.get_concrete_function(*specs)


class Ring:
    """Collectives whose members are `devices`, one tensor per device.

    On one worker the members are `devices`. With `span`, they are every
    tower of every worker: each worker makes the ops of its own `devices`,
    and every collective takes a new key at every run (`keys.run_key`), so
    that the workers agree whichever branch of a step each one runs (all
    its towers, or a small batch on one).

    Args:
        devices: This worker's members, tower 0 first.
        tokens: One resource variable per device that orders its collectives
            (as `tf.distribute.MirroredStrategy` does); without it,
            automatic control dependencies chain the towers' collectives,
            which then wait for each other.
        span: ``(members, timeout_seconds)`` of a group over several
            workers: every worker's towers, and how long a collective
            waits for the others; ``None`` for this worker's `devices`.
    """

    def __init__(
        self,
        devices: Sequence[str],
        tokens: Sequence[tf.Variable],
        span: tuple[int, float] | None = None,
    ):
        self.devices = list(devices)
        self.tokens = list(tokens)
        self.span = span
        self.size = len(self.devices) if span is None else span[0]

    def _key(self) -> int | tf.Tensor:
        return keys.reserve() if self.span is None else keys.run_key()

    def sum(self, values: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """``sum_i values[i]`` over every member, on each of this worker's
        devices; `values[i]` on device ``i``."""
        return self._launch(values, "reduce", self._key())

    def sum_tensors(
        self,
        per_device: Sequence[Sequence[tf.Tensor]],
        options: AllReduceOptions,
    ) -> list[list[tf.Tensor]]:
        """Sums lists of tensors over the devices, in buckets (`buckets`).

        Args:
            per_device: Each device's tensors, of one dtype and of the same
                static shapes on every device, device 0's first.
            options: The bucket size and compression.

        Returns:
            Each device's sums, in the order of its tensors.
        """
        first = per_device[0]
        dtype = first[0].dtype
        shapes = [t.shape for t in first]
        wire = wire_dtype(options, dtype)
        out: list[list] = [[None] * len(first) for _ in per_device]
        for bucket in dtype_buckets(options, shapes, dtype):
            shaped = tuple(tuple(shapes[k].as_list()) for k in bucket)
            packs = _traced(False, shaped, dtype, wire)
            unpacks = _traced(True, shaped, dtype, wire)
            flats = []
            for device, tensors in zip(self.devices, per_device):
                with tf.device(device):
                    flats.append(packs([tensors[k] for k in bucket]))
            for i, total in enumerate(self.sum(flats)):
                with tf.device(self.devices[i]):
                    pieces = unpacks(total)
                for k, value in zip(bucket, pieces):
                    out[i][k] = value
        return out

    def gather_rows(
        self, per_device: Sequence[Sequence[tf.Tensor]]
    ) -> list[list[tf.Tensor]]:
        """Every device's rows, concatenated in device order, on every device.

        `per_device[i]` (on device ``i``) is a list of tensors with the same
        number ``n_i`` of rows (a sparse gradient's values and indices); the
        rest of each tensor's shape is the same on every device. The row
        counts are gathered once, each member's rows are padded to the
        largest count for the gathers (which need equal shapes; on one
        worker, to its bucket's length, `keys.rows_group`), and the padding
        is cut off, as `tf.distribute`'s all-gather does.

        Returns:
            Each device's gathered tensors, in the order given.
        """
        counts = []
        for device, tensors in zip(self.devices, per_device):
            with tf.device(device):
                counts.append(tf.shape(tensors[0], out_type=tf.int64)[:1])
        sizes = self._launch(counts, "gather", self._key())
        # The padded shape changes with the batch, and an instance key keeps
        # the shape it first gathered: on one worker, the rows are padded to
        # a bucket of lengths with a group of its own; over several, whose
        # branches must agree, each gather takes a new key at every run.
        if self.span is None:
            with tf.device(self.devices[0]):
                group, length = keys.rows_group(self.devices, tf.reduce_max(sizes[0]))
            lengths = [length] * len(self.devices)
        else:
            group, lengths = None, []
            for device, n in zip(self.devices, sizes):
                with tf.device(device):
                    lengths.append(tf.reduce_max(n))
        out: list[list[tf.Tensor]] = [[] for _ in per_device]
        for k in range(len(per_device[0])):
            padded = []
            for device, tensors, length in zip(self.devices, per_device, lengths):
                with tf.device(device):
                    value = tensors[k]
                    pad = [[0, length - tf.shape(value, out_type=tf.int64)[0]]]
                    padded.append(
                        tf.pad(value, pad + [[0, 0]] * (value.shape.rank - 1))
                    )
            key = keys.run_key() if group is None else keys.reserve()
            gathered = self._launch(padded, "gather", key, group)
            for i, (device, whole, n) in enumerate(zip(self.devices, gathered, sizes)):
                with tf.device(device):
                    longest = lengths[i]
                    pieces = [
                        whole[j * longest : j * longest + n[j]]
                        for j in range(self.size)
                    ]
                    out[i].append(tf.concat(pieces, axis=0))
        return out

    def _launch(
        self,
        values: Sequence[tf.Tensor],
        kind: str,
        key: int | tf.Tensor,
        group: tf.Tensor | None = None,
    ) -> list[tf.Tensor]:
        if group is None:  # over several workers, the same on every worker
            members = (
                self.devices
                if self.span is None
                else ("every tower of every worker", self.size)
            )
            group = keys.group_key(members)
        size, timeout = self.size, 0.0 if self.span is None else self.span[1]

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
                        timeout_seconds=timeout,
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
