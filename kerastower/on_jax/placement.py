"""Where a JAX `TowerModel` keeps its variables and puts each batch.

The towers are a one-axis `jax.sharding.Mesh` (axis ``"batch"``) over their
devices. Every variable is replicated: each device holds all of it. A batch
whose size ``B`` divides by the number of towers ``N`` is cut along its first
axis into ``N`` contiguous shards of ``B / N`` rows, one per device, and
`jax.jit` compiles the step for that layout (GSPMD): each device computes its
rows, and XLA adds the collectives that a whole-batch quantity needs (a loss's
mean, `BatchNormalization`'s moments, the gradients), so the step is the one
device's step, up to the order of float additions. A batch that does not
divide (the last one of an epoch, or a global batch such as 27 on 4 devices)
is replicated instead: every device computes it whole, exactly as one device
would, at one device's speed. So `fit` compiles at most two layouts, as plain
Keras compiles the two batch shapes of an epoch with a remainder.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kerastower import tower_choice
from kerastower.tower_choice import Towers

BATCH_AXIS = "batch"


def device_name(device: jax.Device) -> str:
    """``"gpu:0"``, ``"cpu:3"``: a device as `keras.distribution.list_devices`
    names it."""
    return f"{device.platform}:{device.id}"


def _normalised(name: str) -> str:
    """``"/device:GPU:0"``, ``"/gpu:0"``, ``"GPU:0"`` -> ``"gpu:0"``."""
    name = name.lower()
    for prefix in ("/device:", "/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.replace("cuda:", "gpu:")


def resolve_devices(towers: Towers) -> list[jax.Device]:
    """The JAX devices of the `towers` argument (`tower_choice.choose_towers`).

    ``None`` is every device of JAX's default backend (its GPUs, or its CPUs:
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` makes ``N``).
    Names are Keras's (``"gpu:0"``) or TensorFlow's (``"/gpu:0"``,
    ``"/device:GPU:0"``).

    Raises:
        ValueError: As `kerastower.tower_choice.choose_towers`.
    """
    by_name = {device_name(d): d for d in jax.devices()}
    every = {device_name(d): d for d in jax.devices()}
    for platform in ("cpu", "gpu", "tpu"):
        try:
            every.update({device_name(d): d for d in jax.devices(platform)})
        except RuntimeError:  # no such backend on this machine
            continue
    names = tower_choice.choose_towers(
        towers,
        available=list(by_name),
        known=list(every),
        find=lambda name: _normalised(name) if _normalised(name) in every else None,
    )
    return [every[name] for name in names]


class Placement:
    """The mesh of the towers' devices and the layouts it gives.

    Args:
        devices: The towers' devices, in the order shards are assigned.
    """

    def __init__(self, devices: list[jax.Device]):
        self.devices = list(devices)
        self.mesh = Mesh(np.array(self.devices), (BATCH_AXIS,))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.sharded = NamedSharding(self.mesh, PartitionSpec(BATCH_AXIS))

    def layout(self, rows: int) -> NamedSharding:
        """`sharded` for a batch of `rows` that divides by the towers, else
        `replicated`."""
        return self.sharded if rows % len(self.devices) == 0 else self.replicated

    def batch(self, data):
        """`data` (a nest of arrays with ``B`` rows each) in `layout(B)`."""
        leaves = jax.tree.leaves(data)
        if not leaves:
            return data
        return jax.device_put(data, self.layout(np.shape(leaves[0])[0]))

    def state(self, state):
        """The variables' values `state`, replicated on every tower.

        Values already replicated here (every step's outputs) are returned as
        they are, checked on the first value of each group, so that a step
        pays nothing; values that a user assigned between steps live on one
        device, uncommitted, and `jax.jit` moves those itself.
        """
        firsts = [group[0] for group in state if len(group)]
        if all(getattr(v, "sharding", None) == self.replicated for v in firsts):
            return state
        return jax.device_put(state, self.replicated)
