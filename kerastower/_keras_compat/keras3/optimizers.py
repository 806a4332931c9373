"""A copy of an optimizer for other variables: every setting, no state.

`replicate_variables=True` gives each tower ``i >= 1`` an optimizer of its own
for its replicas of the model's variables (see
`kerastower.reduce.replicas`). Its update must be the model's optimizer's
update, bit for bit, so it must hold every setting of that optimizer, also
those that `get_config` does not carry: a learning-rate schedule of any class
(registered or not, with or without `get_config`), the variables excluded from
weight decay, the inner optimizer of a `LossScaleOptimizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kerastower._keras_compat.errors import _attribute, _fail
from kerastower._keras_compat.family import keras

# The family's interface: the Keras 2 and Keras 3 modules export the same names.
__all__ = [
    "build_optimizer",
    "clone_optimizer",
    "why_no_replicas",
]


def why_no_replicas() -> str | None:
    """Why towers cannot train on replicas of the variables: ``None``, they
    read them through `keras.StatelessScope`."""
    return None


def build_optimizer(optimizer, variables) -> None:
    """Makes `optimizer`'s state for `variables`, unless it has it."""
    if not optimizer.built:
        optimizer.build(list(variables))


def clone_optimizer(
    optimizer: Any,
    primaries: Sequence[keras.Variable],
    copies: Sequence[keras.Variable],
) -> Any:
    """An optimizer like `optimizer`, built on `copies` of its `primaries`.

    Same class and settings; the learning rate is `optimizer`'s own object
    when it is a schedule or a callable (a schedule is a function of
    ``iterations``, which `kerastower.reduce.replicas` copies before every
    update), and each copy is excluded from weight decay exactly when its
    primary is. The clone's state is new: copy it with the variables.

    Raises:
        ValueError: If `optimizer`'s class cannot be rebuilt from its
            `get_config`.
        KerasCompatibilityError: If the clone would decay other variables
            than `optimizer` decays.
    """
    clone = _unbuilt_clone(optimizer, primaries, copies)
    clone.build(list(copies))
    _check_weight_decay(optimizer, clone, primaries, copies)
    return clone


def _unbuilt_clone(optimizer, primaries, copies):
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        inner = _unbuilt_clone(optimizer.inner_optimizer, primaries, copies)
        return type(optimizer)(
            inner,
            initial_scale=optimizer.initial_scale,
            dynamic_growth_steps=optimizer.dynamic_growth_steps,
            name=optimizer.name,
        )
    rate = _attribute(optimizer, "_learning_rate", "Optimizer")
    scheduled = not isinstance(rate, keras.Variable)
    try:
        if scheduled:
            # `get_config` serialises a schedule, which fails for one without
            # `get_config`, and `from_config` looks up its class, which fails
            # for one not registered: the clone shares the schedule instead.
            optimizer._learning_rate = 0.0
            try:
                config = optimizer.get_config()
            finally:
                optimizer._learning_rate = rate
            config["learning_rate"] = rate
        else:
            config = optimizer.get_config()
        clone = type(optimizer).from_config(config)
    except Exception as error:
        raise ValueError(
            "`replicate_variables=True` gives every tower a copy of the "
            "optimizer, made with `type(optimizer).from_config("
            f"optimizer.get_config())`, which failed for "
            f"{type(optimizer).__name__}: {error!r}. Give the optimizer class "
            "a `get_config` that holds every argument of its `__init__`, or "
            "use `replicate_variables=False`."
        ) from error
    excluded = getattr(optimizer, "_exclude_from_weight_decay", None) or set()
    pattern = getattr(optimizer, "_exclude_from_weight_decay_pattern", None)
    if excluded or pattern is not None:
        key = _attribute(optimizer, "_var_key", "Optimizer")
        clone.exclude_from_weight_decay(
            var_list=[c for p, c in zip(primaries, copies) if key(p) in excluded]
        )
        clone._exclude_from_weight_decay_pattern = pattern
    return clone


def _check_weight_decay(optimizer, clone, primaries, copies) -> None:
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer, clone = optimizer.inner_optimizer, clone.inner_optimizer
    if optimizer.weight_decay is None:
        return
    decays = _attribute(optimizer, "_use_weight_decay", "Optimizer")
    clone_decays = _attribute(clone, "_use_weight_decay", "Optimizer")
    for primary, copy in zip(primaries, copies):
        if decays(primary) != clone_decays(copy):
            raise _fail(
                "Optimizer._exclude_from_weight_decay",
                f"no longer decides whether `{primary.path}` decays",
            )
