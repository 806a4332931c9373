"""Choosing the devices that towers run on."""

from __future__ import annotations

import os

import tensorflow as tf

from kerastower import tower_choice
from kerastower.tower_choice import Towers
from kerastower.workers import cluster
from kerastower.workers.configs import LOGICAL_DEVICES_VARIABLE


def configure_logical_devices(n: int, device_type: str = "CPU") -> list[str]:
    """Splits the first physical CPU (or GPU) into ``n`` logical devices.

    Must run before TensorFlow initialises its runtime (before the first op,
    variable or model; importing TensorFlow, Keras or kerastower is fine).
    Useful to test a multi-tower setup on a laptop: each logical device
    becomes one tower. Called again with the same ``n`` once the runtime has
    started, it returns the existing devices. Wraps TensorFlow's
    `tf.config.set_logical_device_configuration`.

    Example:

    ```python
    import kerastower

    devices = kerastower.configure_logical_devices(4)  # before any TensorFlow work
    print(devices)  # ['/device:CPU:0', '/device:CPU:1', ..., '/device:CPU:3']
    ```

    Args:
        n: How many logical devices to create, an integer of at least 1.
        device_type: ``"CPU"`` or ``"GPU"``. A GPU is split into ``n`` devices
            of 1 GiB each. Defaults to ``"CPU"``.

    Returns:
        The names of the logical devices of that type, such as
        ``["/device:CPU:0", ..., "/device:CPU:3"]``.

    Raises:
        ValueError: If ``n`` is not an integer of at least 1, ``device_type``
            is unknown, there is no physical device of that type, or the
            runtime is already initialised with a different number of logical
            devices.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"`n` must be an integer >= 1. Received: n={n!r}")
    if device_type not in ("CPU", "GPU"):
        raise ValueError(
            "`device_type` must be 'CPU' or 'GPU'. "
            f"Received: device_type={device_type!r}"
        )
    physical = tf.config.list_physical_devices(device_type)
    if not physical:
        raise ValueError(
            f"There is no physical {device_type} to split. "
            f"Received: device_type={device_type!r}"
        )
    config = (
        [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        if device_type == "CPU"
        else [tf.config.LogicalDeviceConfiguration(memory_limit=1024)] * n
    )
    try:
        tf.config.set_logical_device_configuration(physical[0], config)
    except RuntimeError as error:
        existing = tf.config.list_logical_devices(device_type)
        if len(existing) == n:
            return [d.name for d in existing]
        raise ValueError(
            f"Cannot configure {n} logical {device_type} devices: the "
            "TensorFlow runtime is already initialised with "
            f"{len(existing)} ({', '.join(d.name for d in existing)}). Call "
            "`configure_logical_devices` before any TensorFlow operation. "
            f"Received: n={n}"
        ) from error
    # Listing logical devices would start the runtime, which must stay
    # unstarted for `MultiWorkerMirroredStrategy` to set up its cluster.
    return [f"/device:{device_type}:{i}" for i in range(n)]


def configure_from_environment() -> list[str] | None:
    """Configures ``$KERASTOWER_LOGICAL_DEVICES`` logical CPUs, when set.

    ``kerastower launch --towers k`` sets the variable for each worker it
    starts, so that a script written for one machine gets ``k`` towers on a
    machine without a GPU. kerastower calls this when it is imported. On a
    machine with GPUs the variable is ignored: the towers are the GPUs.

    Returns:
        The logical CPU names it configured, or ``None`` when the variable is
        unset or there is a GPU.

    Raises:
        ValueError: If the variable is not an integer of at least 1.
    """
    text = os.environ.get(LOGICAL_DEVICES_VARIABLE, "").strip()
    if not text or tf.config.list_physical_devices("GPU"):
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"`{LOGICAL_DEVICES_VARIABLE}` must be an integer >= 1. "
            f"Received: {LOGICAL_DEVICES_VARIABLE}={text!r}"
        )
    return configure_logical_devices(n)


def available_devices() -> list[str]:
    """Returns the devices towers can use: all GPUs, else all CPUs.

    This is what ``TowerModel(towers=None)`` uses; ``kerastower devices``
    prints it from the command line.

    Example:

    ```python
    import kerastower

    print(kerastower.available_devices())  # ['/device:CPU:0'] without a GPU
    ```

    Returns:
        Logical device names: every visible GPU if there is one, otherwise
        every logical CPU.
    """
    gpus = _local([d.name for d in tf.config.list_logical_devices("GPU")])
    if gpus:
        return gpus
    return _local([d.name for d in tf.config.list_logical_devices("CPU")])


def _local(names: list[str]) -> list[str]:
    """Keeps this worker's devices: under a multi-worker `TF_CONFIG`,
    TensorFlow also lists every other worker's devices."""
    specs = [tf.DeviceSpec.from_string(name) for name in names]
    if all(spec.job in (None, "localhost") for spec in specs):
        return names
    config = cluster.tf_config()
    task = (config or {}).get("task", {})
    return [
        name
        for name, spec in zip(names, specs)
        if spec.job == task.get("type") and spec.task == task.get("index")
    ]


def _matches(wanted: tf.DeviceSpec, device: tf.DeviceSpec) -> bool:
    if (wanted.device_type or "").upper() != (device.device_type or "").upper():
        return False
    if wanted.device_index != device.device_index:
        return False
    return all(
        None in (getattr(wanted, field), getattr(device, field))
        or getattr(wanted, field) == getattr(device, field)
        for field in ("job", "replica", "task")
    )


def resolve_towers(towers: Towers) -> list[str]:
    """Turns the `towers` argument of `TowerModel` into device names.

    Args:
        towers: ``None`` for every available device (all GPUs, or all logical
            CPUs when there is no GPU); an integer ``n >= 1`` for the first
            ``n`` of them; or a list of device names.

    Returns:
        The list of device names, one per tower.

    Raises:
        ValueError: If `towers` is not one of the above, asks for more devices
            than are available, or names a device that does not exist.
    """
    known = [d.name for d in tf.config.list_logical_devices()]

    def find(name: str) -> str | None:
        wanted = tf.DeviceSpec.from_string(name if "/" in name else f"/device:{name}")
        found = [d for d in known if _matches(wanted, tf.DeviceSpec.from_string(d))]
        return found[0] if found else None

    return tower_choice.choose_towers(towers, available_devices(), known, find)


def saved_towers(towers: Towers) -> Towers:
    """The `towers` of a saved `TowerModel`, or ``None`` where this machine
    cannot provide them (`kerastower.tower_choice.saved_towers`)."""
    return tower_choice.saved_towers(towers, resolve_towers)
