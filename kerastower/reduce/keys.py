"""The keys of kerastower's collective operations, from one allocator.

TensorFlow's collective ops (``CollectiveReduceV2``) meet by key: every member
of a group issues a collective with the same ``group_key`` and
``instance_key``, and two collectives of one process must not share an
instance key within a group. kerastower issues three kinds, all keyed here:

- the sums over the workers' first towers (`kerastower.reduce.towers`):
  one group, `WORKERS_GROUP_KEY`, one member per worker, and one key per sum
  reserved where the step is traced. Every worker must issue the same keys
  in the same order, and a step's two branches (all towers, or a small
  batch whole on one) must issue the same keys too, so each step has a
  `StepBlock` of keys and numbers its sums inside the branches from the
  block's start. TensorFlow remembers the shape an instance key first
  summed: where a step's sums change shape with the global batch (the
  predictions gathered for ``global_batch_loss``), they meet in a group per
  batch size (`batch_group_key`), and a gather of sparse rows over the
  workers pads them to a bucket of row counts with a group of its own
  (`rows_group`);
- the sums over the calls of a tower traced once
  (`kerastower.reduce.towers.TowerCollectives`): one group per set of tower
  devices (`group_key`), or over several workers one per set of workers that
  run their batch on one tower (`calls_group`), the instance keys reserved
  once per trace; where
  the sums change shape with the batch (the predictions gathered for
  ``global_batch_loss``), one group per set of devices and batch size
  (`batch_group_key`), so that each group's keys keep one shape and new
  keys are not taken at every run (TensorFlow keeps every key it has seen:
  a key per run grew a process by 5 KB a step);
- the ring all-reduces and all-gathers of the replicas
  (`kerastower.reduce.ring`): one group per set of tower devices
  (`group_key`), one key per all-reduce; a gather of sparse gradient rows,
  whose count changes with the batch, pads them to a bucket of row counts
  and gathers in one group per set of devices and bucket (`rows_group`),
  with the trace's keys. Over several workers, whose step branches must
  agree, every ring collective takes a new key at every run (`run_key`).

Every process traces its steps in the same order, so the keys agree across
workers. TensorFlow's own strategies number their groups up from 1: ours
start far above.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

WORKERS_GROUP_KEY = 0x6B740001
_FIRST_DEVICE_GROUP_KEY = 0x6B741000
# Groups of a set of devices and a batch size (`batch_group_key`): keys in
# [2**28, 2**29), apart from TensorFlow's (from 1) and the ones above.
BATCH_GROUPS = 1 << 28
MAX_GROUP_BATCH = 1 << 20
MAX_BATCH_GROUP_SETS = 1 << 8
# Groups of a set of devices and a bucket of row counts (`rows_group`): keys
# in [2**29, 2**29 + MAX_BATCH_GROUP_SETS * ROW_BUCKETS).
ROWS_GROUPS = 1 << 29
ROW_BUCKETS = 1 << 12
_EXACT_ROWS = 128  # row counts below this are buckets of their own
# Groups of the traced towers' calls over several workers (`calls_group`):
# keys in [2**29 + 2**20, 2**29 + 2**20 + 2**MAX_TRACED_WORKERS).
CALL_GROUPS = ROWS_GROUPS + MAX_BATCH_GROUP_SETS * ROW_BUCKETS
MAX_TRACED_WORKERS = 16
_BUCKETS_PER_OCTAVE = 64
_FIRST_INSTANCE_KEY = 1 << 20
# The most sums over the workers one step may issue: a step reserves a block
# of them where it is traced (at each call when eager).
STEP_BLOCK = 1 << 12

_device_groups: dict[tuple[str, ...], int] = {}
_next_instance_key = _FIRST_INSTANCE_KEY


def group_key(devices: Sequence[str]) -> int:
    """The group key of a collective over `devices`, one per distinct set.

    Args:
        devices: The device of each member, in order.

    Returns:
        The same key for the same devices, every time.
    """
    members = tuple(devices)
    if members not in _device_groups:
        _device_groups[members] = _FIRST_DEVICE_GROUP_KEY + len(_device_groups)
    return _device_groups[members]


def batch_group_key(devices: Sequence[str], batch: tf.Tensor) -> tf.Tensor:
    """The group key of collectives over `devices` whose shapes follow `batch`.

    One group per set of devices (as `group_key`) and batch size ``B``:
    ``BATCH_GROUPS + d * MAX_GROUP_BATCH + B`` for the ``d``-th set, so that
    a group's instance keys always sum the same shapes.

    Args:
        devices: The device of each member, in order.
        batch: ``B``, an int32 scalar tensor, below `MAX_GROUP_BATCH`.

    Raises:
        RuntimeError: If more than `MAX_BATCH_GROUP_SETS` sets of devices
            took batch groups.
        tf.errors.InvalidArgumentError: When run, if ``B`` is not below
            `MAX_GROUP_BATCH`.
    """
    index = _set_index(devices)
    batch = tf.convert_to_tensor(batch, tf.int32)
    checked = tf.debugging.assert_less(
        batch,
        MAX_GROUP_BATCH,
        message=f"`global_batch_loss` gathers batches of fewer than "
        f"{MAX_GROUP_BATCH} examples per tower group",
    )
    with tf.control_dependencies([checked]):
        return BATCH_GROUPS + index * MAX_GROUP_BATCH + batch


def _set_index(devices: Sequence[str]) -> int:
    """The index of `devices` among the sets of devices that took groups
    (`group_key`), below `MAX_BATCH_GROUP_SETS`."""
    index = group_key(devices) - _FIRST_DEVICE_GROUP_KEY
    if index >= MAX_BATCH_GROUP_SETS:
        raise RuntimeError(
            f"More than {MAX_BATCH_GROUP_SETS} sets of tower devices took groups "
            "of a batch size or row count; "
            "kerastower.reduce.keys.MAX_BATCH_GROUP_SETS must grow."
        )
    return index


def _floor_log2(n: tf.Tensor) -> tf.Tensor:
    """``floor(log2 n)`` of an int64 ``n >= 1``, exactly."""
    powers = tf.constant([1 << k for k in range(63)], tf.int64)
    return tf.reduce_sum(tf.cast(n >= powers, tf.int64)) - 1


def row_bucket(rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The row count a gather of `rows` rows is padded to, and its bucket.

    A count ``n`` below 128 is a bucket of its own. Above, each octave
    ``[2^e, 2^(e+1))`` has 64 buckets of ``s = 2^(e-6)`` rows, and ``n`` is
    padded to ``L = s * ceil(n / s)``, less than ``n / 64`` more rows:

        bucket(n) = n                                  if n < 128
                    128 + 64 (e' - 7) + L / 2^(e'-6) - 64   else, e' = floor(log2 L)

    Every count has a bucket below `ROW_BUCKETS`, and a bucket has one
    padded length.

    Args:
        rows: ``0 <= n < 2^62``, an int64 scalar tensor.

    Returns:
        ``(L, bucket)``, int64 scalar tensors.
    """
    n = tf.convert_to_tensor(rows, tf.int64)
    large = n >= _EXACT_ROWS
    shift = tf.where(large, _floor_log2(tf.maximum(n, 1)) - 6, 0)
    step = tf.bitwise.left_shift(tf.constant(1, tf.int64), shift)
    padded = (n + step - 1) // step * step
    octave = tf.where(large, _floor_log2(tf.maximum(padded, 1)), 7)
    within = tf.bitwise.right_shift(padded, tf.maximum(octave - 6, 0))
    bucket = _EXACT_ROWS + _BUCKETS_PER_OCTAVE * (octave - 7) + within - 64
    return padded, tf.where(large, bucket, n)


def rows_group(devices: Sequence[str], rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The group of a gather over `devices` of `rows` rows per member.

    One group per set of devices (as `group_key`) and bucket of row counts
    (`row_bucket`), ``ROWS_GROUPS + d * ROW_BUCKETS + bucket`` for the
    ``d``-th set: the members pad their rows to the bucket's length, so
    that a group's instance keys always gather the same shapes.

    Args:
        devices: The device of each member, in order.
        rows: The most rows of any member, an int64 scalar tensor.

    Returns:
        ``(group_key, padded_rows)``: int32 and int64 scalar tensors.

    Raises:
        RuntimeError: If more than `MAX_BATCH_GROUP_SETS` sets of devices
            took such groups.
    """
    index = _set_index(devices)
    padded, bucket = row_bucket(rows)
    group = ROWS_GROUPS + index * ROW_BUCKETS + tf.cast(bucket, tf.int32)
    return group, padded


def calls_group(batches: tf.Tensor, towers: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The group of the traced towers' calls of one step over every worker.

    Worker ``w`` calls its tower function on each of its ``N_w`` towers, or
    once, on its first, when its batch ``B_w < N_w``: the group has
    ``sum_w (N_w if B_w >= N_w else 1)`` members, and its key tells which
    workers ran one call, ``CALL_GROUPS + sum_w [B_w < N_w] 2^w``, so that
    every worker names the same members the same way.

    Args:
        batches: ``(B_0, ..., B_{W-1})``, every worker's batch, int32.
        towers: ``(N_0, ..., N_{W-1})``, every worker's towers, int32; at most
            `MAX_TRACED_WORKERS` workers.

    Returns:
        ``(group_size, group_key)``, int32 scalar tensors.
    """
    whole = tf.cast(batches < towers, tf.int32)
    size = tf.reduce_sum(tf.where(whole > 0, 1, towers))
    bits = tf.bitwise.left_shift(1, tf.range(tf.size(whole), dtype=tf.int32))
    return size, CALL_GROUPS + tf.reduce_sum(whole * bits)


def reserve(count: int = 1) -> int:
    """Reserves `count` consecutive instance keys no collective has used.

    Args:
        count: How many keys, an integer >= 1. Defaults to 1.

    Returns:
        The first of the keys; the others follow it.

    Raises:
        ValueError: If `count` is not an integer >= 1.
        RuntimeError: If the process has run out of int32 instance keys.
    """
    global _next_instance_key
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"`count` must be an integer >= 1. Received: count={count!r}")
    first = _next_instance_key
    if first + count > 2**31:
        raise RuntimeError(
            "kerastower has used every collective instance key of this process "
            f"(traced steps: about {(first - _FIRST_INSTANCE_KEY) // STEP_BLOCK})."
        )
    _next_instance_key += count
    return first


STEP_KEYS = 1 << 16
_step_keys: dict[tuple[int, str], int] = {}  # first key of each step's range
_tracing = threading.local()  # `.keys`: [first, taken] of the step tracing now


@contextlib.contextmanager
def step_keys(owner: Any, step: str) -> Iterator[None]:
    """Numbers the instance keys over the workers of a step being traced.

    Inside, `worker_key` takes the keys of `owner`'s `step`
    (``"train_step"``, ``"test_step"``) in order from a range of
    `STEP_KEYS` keys of its own, which the step's first trace reserves:
    every later trace takes the same keys, until Keras makes a new function
    for the step (`forget_step_keys`).
    A worker whose step traces again (Keras's ``train_on_batch`` does for a
    batch of a new shape, which another worker may not have) then still
    meets the others. Nested uses keep the outermost range.

    Args:
        owner: The model whose step traces.
        step: Which of its steps.
    """
    if getattr(_tracing, "keys", None) is not None:
        yield
        return
    named = (id(owner), step)
    if named not in _step_keys:
        _step_keys[named] = reserve(STEP_KEYS)
    _tracing.keys = [_step_keys[named], 0]
    try:
        yield
    finally:
        _tracing.keys = None


def forget_step_keys(owner: Any, step: str) -> None:
    """Makes the next trace of `owner`'s `step` reserve a new range
    (`step_keys`): Keras made a new function for it."""
    _step_keys.pop((id(owner), step), None)


def worker_key(count: int = 1) -> int:
    """The first of `count` instance keys for collectives over the workers.

    Traced inside `step_keys`, the step's next keys; else (eager, or outside
    a step) keys no collective has used (`reserve`).

    Raises:
        RuntimeError: If a step's trace takes more than `STEP_KEYS` keys.
    """
    current = getattr(_tracing, "keys", None)
    if current is None or tf.executing_eagerly():
        return reserve(count)
    first, taken = current
    if taken + count > STEP_KEYS:
        raise RuntimeError(
            f"A step took more than {STEP_KEYS} collective keys over the "
            "workers; kerastower.reduce.keys.STEP_KEYS must grow."
        )
    current[1] = taken + count
    return first + taken


RUN_KEYS = 1 << 29
_run_keys: list = []  # [first key, counter variable], made by `run_key`


def prepare_run_keys() -> None:
    """Makes `run_key`'s counter and reserves its keys, once per process.

    Call it eagerly before a step that takes run keys traces (`TowerModel`
    does, before Keras makes its step functions): a variable made while a
    `tf.function` traces makes it trace twice.
    """
    if not _run_keys:
        with tf.init_scope(), tf.device("/CPU:0"):
            counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="run_key")
            _run_keys.extend([reserve(RUN_KEYS), counter])


def run_key() -> tf.Tensor:
    """An instance key that is new at every run of the op that makes it.

    For a collective whose shape may change from one run to the next (rows
    gathered from each tower's batch): a traced step that runs it several
    times in one call (``steps_per_execution``) takes a new key each time,
    unlike `StepBlock`'s. A process-wide counter on the CPU counts the runs
    in a block of `RUN_KEYS` keys, reserved at the first use
    (`prepare_run_keys`); after `RUN_KEYS` runs the keys come round again.
    """
    prepare_run_keys()
    first, counter = _run_keys
    with tf.device("/CPU:0"):
        runs = counter.assign_add(1, read_value=True)
        return first + tf.math.floormod(runs, RUN_KEYS)


def first_towers(workers: int) -> tuple[str, int]:
    """The members of a group over the first tower of each of `workers`
    workers, as `group_key`, `batch_group_key` and `rows_group` take them."""
    return ("the first tower of every worker", workers)


class StepBlock:
    """The instance keys and the group of one step's sums over the workers.

    Make it where the step is traced, outside its branches; `key` gives the
    key of the ``k``-th sum. The keys are the trace's: every call of the
    step, and every step of a loop of them (``steps_per_execution``), uses
    the same keys, which suits sums of fixed shapes, made in
    `WORKERS_GROUP_KEY`. Where the sums change shape with the global batch
    (the batch gathered for ``global_batch_loss``), pass `batch`: the sums
    then meet in a group of that batch size (`batch_group_key` over
    `first_towers`), whose keys always sum the same shapes.

    Args:
        workers: How many workers sum together.
        batch: ``B``, the global batch size, an int32 scalar tensor, or
            ``None`` for sums of fixed shapes.
    """

    def __init__(self, workers: int, batch: tf.Tensor | None = None):
        self._first = worker_key(STEP_BLOCK)
        self.group = (
            WORKERS_GROUP_KEY
            if batch is None
            else batch_group_key(first_towers(workers), batch)
        )

    def key(self, k: int) -> int:
        """The instance key of the step's ``k``-th sum (from 0).

        Raises:
            RuntimeError: If the step sums more than `STEP_BLOCK` times.
        """
        if k >= STEP_BLOCK:
            raise RuntimeError(
                f"A step summed more than {STEP_BLOCK} tensors over the "
                "workers; kerastower.reduce.keys.STEP_BLOCK must grow."
            )
        return self._first + k
