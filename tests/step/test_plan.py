"""A step's plan: which way it runs, decided once per trace (`StepPlan`)."""

import numpy as np
import pytest
import tensorflow as tf
from keras_family import keras

import kerastower
from kerastower import _keras_compat
from kerastower.step import plan as plan_lib
from kerastower.step.plan import COPIES, ONE_DEVICE, TRACED_ONCE, StepPlan
from kerastower.step.tower_step import TowerStep

RNG = np.random.default_rng(5)
X = RNG.normal(size=(8, 3)).astype("float32")
Y = RNG.normal(size=(8, 1)).astype("float32")


def tower_model(towers, jit_compile=False):
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model = kerastower.TowerModel.from_model(plain, towers=towers)
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    return model


def traced_plan(model, **kwargs):
    """The plan `model` makes inside a traced function."""
    made = []
    tf.function(lambda: made.append(StepPlan.of(model, **kwargs)) or 0)()
    return made[0]


def test_one_tower_on_one_worker_runs_keras_own_step():
    model = tower_model(1)
    plan = traced_plan(model)
    assert (plan.towers, plan.workers, plan.xla) == (ONE_DEVICE, 1, False)
    assert plan.keras_step
    accumulating = traced_plan(model, accumulator=object())
    assert accumulating.towers == ONE_DEVICE and not accumulating.keras_step


def test_several_towers_are_traced_once_where_the_settings_allow():
    model = tower_model(2)
    expected = TRACED_ONCE if _keras_compat.keeps_functions_apart() else COPIES
    assert traced_plan(model).towers == expected
    assert not traced_plan(model).keras_step
    # Run eagerly, the towers are copies run one by one.
    assert StepPlan.of(model).towers == COPIES


def test_xla_compiles_copies():
    plan = traced_plan(tower_model(2, jit_compile=True))
    assert (plan.towers, plan.xla) == (COPIES, True)
    # Eagerly nothing is compiled.
    assert not StepPlan.of(tower_model(2, jit_compile=True)).xla


def test_several_workers_trace_once_but_for_a_gathered_loss():
    from kerastower.reduce import keys
    from kerastower.step import traced_towers

    traceable = _keras_compat.keeps_functions_apart()
    for towers in (1, 2):
        model = tower_model(towers)
        assert traced_towers.applies(model, 2) is traceable
        assert not traced_towers.applies(model, keys.MAX_TRACED_WORKERS + 1)
    # One tower on one worker is Keras's own step.
    assert not traced_towers.applies(tower_model(1), 1)
    # The batch gathered for `global_batch_loss` would need a group per
    # batch size and set of workers: copies on several workers.
    gathered = tower_model(2)
    gathered.global_batch_loss = True
    assert traced_towers.applies(gathered, 1) is traceable
    assert not traced_towers.applies(gathered, 2)


def test_prediction_does_not_span_the_workers():
    model = tower_model(1)
    plan = traced_plan(model, across_workers=False)
    assert (plan.towers, plan.workers) == (ONE_DEVICE, 1)


@pytest.mark.parametrize("towers", [1, 2])
def test_every_traced_step_reads_the_one_plan_made_for_it(monkeypatch, towers):
    made, read = [], []
    real_of = StepPlan.of.__func__

    def counting_of(cls, *args, **kwargs):
        made.append(real_of(cls, *args, **kwargs))
        return made[-1]

    def recording(method):
        def step(self, data, plan):
            read.append(plan)
            return method(self, data, plan)

        return step

    monkeypatch.setattr(plan_lib.StepPlan, "of", classmethod(counting_of))
    for name in ("train", "test", "predict"):
        monkeypatch.setattr(TowerStep, name, recording(getattr(TowerStep, name)))
    model = tower_model(towers)
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    model.evaluate(X, Y, batch_size=4, verbose=0)
    model.predict(X, batch_size=4, verbose=0)
    # One plan per trace of each step (train, test, predict: at least one
    # each), and every tower step ran on a plan made for it.
    assert len(made) >= 3
    assert all(any(p is m for m in made) for p in read)
    if towers == 1:
        assert read == [] and all(p.towers == ONE_DEVICE for p in made)
    else:
        assert len(read) == len(made)
