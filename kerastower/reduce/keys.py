"""The keys of kerastower's collective operations, from one allocator.

TensorFlow's collective ops (``CollectiveReduceV2``) meet by key: every member
of a group issues a collective with the same ``group_key`` and
``instance_key``, and two collectives of one process must not share an
instance key within a group. kerastower issues two kinds, both keyed here:

- the sums over the workers' first towers inside a step
  (`kerastower.reduce.towers.TowerSum`): one group, `WORKERS_GROUP_KEY`, one
  member per worker. Every worker must issue the same keys in the same order,
  and a step's two branches (all towers, or a small batch whole on one) must
  issue the same keys too, so a step reserves a block of keys
  (`reserve(STEP_BLOCK)`) and numbers its sums from the block's start;
- the ring all-reduces of the replicas (`kerastower.reduce.replicas`): one
  group per set of tower devices (`group_key`), one key per all-reduce.

Every process traces its steps in the same order, so the keys agree across
workers. TensorFlow's own strategies number their groups up from 1: ours
start far above.
"""

from __future__ import annotations

from collections.abc import Sequence

WORKERS_GROUP_KEY = 0x6B740001
_FIRST_DEVICE_GROUP_KEY = 0x6B741000
_FIRST_INSTANCE_KEY = 1 << 20
# Instance keys are int32: room for about 500,000 steps' blocks.
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
