"""Which devices the `towers` argument of `TowerModel` asks for.

Plain Python, the same on every backend: each backend passes the devices it
has and a way to find a device by the name a user gives
(`kerastower.devices` on TensorFlow, `kerastower.on_jax.placement` on JAX).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

Towers = int | Sequence[str] | None


def choose_towers(
    towers: Towers,
    available: list[str],
    known: list[str],
    find: Callable[[str], str | None],
) -> list[str]:
    """Turns the `towers` argument of `TowerModel` into device names.

    Args:
        towers: ``None`` for every available device; an integer ``n >= 1`` for
            the first ``n`` of them; or a list of device names.
        available: The devices towers run on by default, in order.
        known: Every device a name may pick, for the error message.
        find: The device of `known` that a user's name means, or ``None``.

    Returns:
        The list of device names, one per tower.

    Raises:
        ValueError: If `towers` is not one of the above, asks for more devices
            than are available, or names a device that does not exist.
    """
    if towers is None:
        return list(available)
    if isinstance(towers, bool) or isinstance(towers, (float, str, bytes)):
        raise ValueError(
            "`towers` must be None, an integer >= 1 or a list of device "
            f"names. Received: towers={towers!r}"
        )
    if isinstance(towers, int):
        if towers < 1:
            raise ValueError(
                f"`towers` must be an integer >= 1. Received: towers={towers}"
            )
        if towers > len(available):
            raise ValueError(
                f"`towers` must be at most the number of available devices "
                f"({len(available)}: {', '.join(available)}). "
                f"Received: towers={towers}"
            )
        return list(available[:towers])
    if isinstance(towers, Sequence):
        names = list(towers)
        if not names or not all(isinstance(n, str) for n in names):
            raise ValueError(
                "`towers` as a list must hold one or more device names. "
                f"Received: towers={towers!r}"
            )
        resolved = []
        for name in names:
            found = find(name)
            if found is None:
                raise ValueError(
                    f"`towers` names a device that does not exist: {name!r}. "
                    f"Available: {', '.join(known)}. "
                    f"Received: towers={towers!r}"
                )
            resolved.append(found)
        if len(set(resolved)) != len(resolved):
            raise ValueError(
                f"`towers` must not name a device twice. Received: towers={towers!r}"
            )
        return resolved
    raise ValueError(
        "`towers` must be None, an integer >= 1 or a list of device names. "
        f"Received: towers={towers!r}"
    )


def saved_towers(towers: Towers, resolve: Callable[[Towers], list[str]]) -> Towers:
    """The `towers` of a saved `TowerModel`, or ``None`` where unavailable.

    A model saved on a machine with more devices (or other device names)
    loads on this one over every available device, with a warning.

    Args:
        towers: The `towers` argument the model was saved with.
        resolve: The backend's `choose_towers` over this machine's devices.

    Returns:
        `towers`, or ``None`` when this machine cannot provide them.
    """
    try:
        resolve(towers)
    except ValueError as error:
        warnings.warn(
            f"The saved model asked for towers={towers!r}, which this "
            f"machine cannot provide ({error}); using every available "
            "device instead.",
            stacklevel=4,  # the caller of the model's `from_config`
        )
        return None
    return towers
