"""Whether a model's towers train on replicas: ``replicate_variables`` resolved.

``TowerModel(replicate_variables=...)`` takes ``True``, ``False`` or
``"auto"`` (the default). ``"auto"`` replicates where the towers are separate
accelerators, the case replicas are for: every tower on its own GPU, on one
worker (``True`` or the variable below replicate on several workers too, in
one ring over every worker's towers); for a `train_step` of one's own, on 5
GPUs or more. There, without replicas, the
first GPU would move about ``N`` times the bytes of a ring all-reduce per step
(see `kerastower.reduce.replicas`). On logical CPUs, which share one memory,
the towers read the model's variables, which costs less.

Keras 2 has no replicas yet (a tower would need to read its own copies of the
layers' variables, which Keras 3's `keras.StatelessScope` gives): there
``"auto"`` does not replicate and ``True`` is an error.

``$KERASTOWER_REPLICATE_VARIABLES`` decides ``"auto"`` on any device: ``1``
trains on replicas wherever there are several towers or several workers (so
that tests take the GPU path on logical CPUs), ``0`` never. An explicit ``True`` or
``False`` is kept whatever the variable says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat

FORCE_VARIABLE = "KERASTOWER_REPLICATE_VARIABLES"


def check_setting(setting: object) -> bool | str:
    """Returns `setting` if it is a valid ``replicate_variables``.

    Raises:
        ValueError: If `setting` is not ``True``, ``False`` or ``"auto"``.
    """
    if isinstance(setting, bool) or setting == "auto":
        return setting
    raise ValueError(
        "`replicate_variables` must be True, False or 'auto'. "
        f"Received: replicate_variables={setting!r}"
    )


def forced(environ: Mapping[str, str] | None = None) -> bool | None:
    """``$KERASTOWER_REPLICATE_VARIABLES`` as a bool; ``None`` when unset.

    Raises:
        ValueError: If it is set to anything but ``0`` or ``1``.
    """
    text = (os.environ if environ is None else environ).get(FORCE_VARIABLE, "")
    if not text.strip():
        return None
    if text.strip() not in ("0", "1"):
        raise ValueError(
            f"`${FORCE_VARIABLE}` must be 0 or 1. Received: {FORCE_VARIABLE}={text!r}"
        )
    return text.strip() == "1"


def on_accelerators(devices: Sequence[str]) -> bool:
    """Whether every device in `devices` is a GPU (or another accelerator)."""
    return all(
        (tf.DeviceSpec.from_string(name).device_type or "CPU").upper() != "CPU"
        for name in devices
    )


# A `train_step` of one's own broadcasts the weights through the ring in each
# step, so its busiest device moves about twice the ring bound, against
# ``N / 2`` times without replicas (`python -m bench.traffic`): replicas pay
# from 5 towers on.
OWN_STEP_MIN_TOWERS = 5


def replicates(
    setting: bool | str,
    devices: Sequence[str],
    num_workers: int = 1,
    environ: Mapping[str, str] | None = None,
    own_step: bool = False,
) -> bool:
    """Whether towers on `devices` train on replicas of the variables.

    Args:
        setting: ``replicate_variables``: ``True``, ``False`` or ``"auto"``.
        devices: The tower devices of this worker.
        num_workers: The number of workers training together.
        environ: The environment to read ``$KERASTOWER_REPLICATE_VARIABLES``
            from; ``None`` for `os.environ`.
        own_step: Whether the model trains with a `train_step` of its own,
            which applies its gradients itself.

    Returns:
        ``False`` for one tower on one worker (on several, every worker
        decides alike, whatever its towers: they share one ring); `setting`
        when it is a bool; for ``"auto"``, the environment variable's value
        when set, else whether this is one worker whose towers are all
        accelerators, at least `OWN_STEP_MIN_TOWERS` of them for
        `own_step`. ``False`` on Keras 2.

    Raises:
        ValueError: For ``True`` on Keras 2, with several towers or workers.
    """
    setting = check_setting(setting)
    if num_workers == 1 and len(devices) < 2:
        return False
    refused = _keras_compat.why_no_replicas()
    if refused is not None:
        if setting is True:
            raise ValueError(
                f"`replicate_variables=True` needs Keras 3: {refused}. "
                "Received: replicate_variables=True"
            )
        return False
    if setting != "auto":
        return bool(setting)
    force = forced(environ)
    if force is not None:
        return force
    if own_step and len(devices) < OWN_STEP_MIN_TOWERS:
        return False
    return num_workers == 1 and on_accelerators(devices)


def inference_reads(replicas: Any, variables: Sequence[Any]) -> tuple[list, Any]:
    """``(variables, replicas)`` for the towers of `evaluate` and `predict`.

    Each tower reads its replicas of the trainable `variables` when they are
    made (`kerastower.entry_points` copies the model's weights to them
    first); else the model's weights: ``([], None)``.
    """
    if replicas is not None and replicas.matches(variables):
        return list(variables), replicas
    return [], None
