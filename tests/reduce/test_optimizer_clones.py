"""Replicas update as the model's optimizer does, whatever it holds.

`replicate_variables=True` gives every tower ``i >= 1`` a clone of the
optimizer (`kerastower._keras_compat.keras3.optimizers.clone_optimizer`). Each case
here once trained differently from one device or failed to build: AdamW's
exclusions were lost (1.3e-3 off), a schedule without `get_config` or not
registered failed to clone, and the replicas carried no constraint (0.37 off
under `NonNeg`).
"""

import math

import keras
import numpy as np
import pytest
from oracle import (
    assert_same_history,
    assert_same_weights,
    max_weight_diff,
    mlp,
    regression_data,
)

import kerastower


class WarmUpCosine(keras.optimizers.schedules.LearningRateSchedule):
    """keras.io's masked image modeling schedule: no `get_config`, not
    registered."""

    def __init__(self, base, total, warmup):
        super().__init__()
        self.base, self.total, self.warmup = base, total, warmup

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        cosine = 0.5 * self.base * (1 + keras.ops.cos(math.pi * step / self.total))
        return keras.ops.where(
            step < self.warmup, self.base * (step + 1) / self.warmup, cosine
        )


def adamw_excluding(model):
    optimizer = keras.optimizers.AdamW(0.02, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(
        var_list=[model.trainable_weights[0]], var_names=["bias"]
    )
    return optimizer


CASES = {
    "adamw_exclusions": (mlp, adamw_excluding),
    "unregistered_schedule": (
        mlp,
        lambda model: keras.optimizers.Adam(WarmUpCosine(0.05, 12, 3)),
    ),
    "callable_rate": (
        mlp,
        lambda model: keras.optimizers.SGD(lambda: 0.03, momentum=0.5),
    ),
    "loss_scale_over_a_schedule": (
        mlp,
        lambda model: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(WarmUpCosine(0.1, 12, 3))
        ),
    ),
    # The scale doubles at every step: a tower that scaled its loss by
    # another scale than the one the update divides by would be off by a
    # power of 2.
    "loss_scale_growing": (
        mlp,
        lambda model: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), initial_scale=16.0, dynamic_growth_steps=1
        ),
    ),
    "non_neg_and_max_norm": (
        lambda: mlp(
            kernel_constraint=keras.constraints.NonNeg(),
            bias_constraint=keras.constraints.MaxNorm(0.05),
        ),
        lambda model: keras.optimizers.SGD(0.3),
    ),
}


@pytest.mark.parametrize("replicate", [True, False], ids=["replicas", "shared"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_trains_as_one_device(case, replicate):
    build, optimizer = CASES[case]
    x, y = regression_data(n=23)
    plain = build()
    towered = kerastower.TowerModel.from_model(
        build(), towers=3, replicate_variables=replicate
    )
    towered.set_weights(plain.get_weights())
    histories = []
    for model in (plain, towered):
        model.compile(optimizer=optimizer(model), loss="mse", metrics=["mae"])
        fit = model.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
        histories.append(fit.history)
    assert_same_history(*histories)
    assert_same_weights(plain, towered)
    if replicate:
        replicas = towered._tower_step.replicas
        for tower in (1, 2):
            for primary, copy in zip(
                replicas.replica_variables(0), replicas.replica_variables(tower)
            ):
                np.testing.assert_array_equal(copy.numpy(), primary.numpy())


# The same models and optimizers without the settings above.
BARE = {
    "adamw_exclusions": (
        mlp,
        lambda model: keras.optimizers.AdamW(0.02, weight_decay=0.5),
    ),
    "non_neg_and_max_norm": (mlp, lambda model: keras.optimizers.SGD(0.3)),
}


@pytest.mark.parametrize("case", sorted(BARE))
def test_the_settings_change_training(case):
    # A clone that dropped them trains as without them: far from one device.
    x, y = regression_data(n=23)
    trained = []
    for build, optimizer in (CASES[case], BARE[case]):
        model = build()
        model.compile(optimizer=optimizer(model), loss="mse")
        model.fit(x, y, batch_size=6, epochs=2, shuffle=False, verbose=0)
        trained.append(model)
    assert max_weight_diff(*trained) > 1e-3


class Scaled(keras.optimizers.SGD):
    """An optimizer whose `get_config` lacks an argument of its `__init__`."""

    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor


def test_an_optimizer_that_cannot_be_rebuilt_names_the_way_out():
    x, y = regression_data(n=12)
    model = kerastower.TowerModel.from_model(mlp(), towers=2, replicate_variables=True)
    model.compile(optimizer=Scaled(2.0, learning_rate=0.1), loss="mse")
    with pytest.raises(ValueError, match=r"Scaled.*`replicate_variables=False`"):
        model.fit(x, y, batch_size=4, verbose=0)
