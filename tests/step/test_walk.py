"""A batch's path through the package goes down, never back into a module it left.

While a step traces, every call into a package module (outside the Keras
fence, `kerastower._keras_compat`, whose hooks Keras calls) is checked: if
that module is already on the stack below another package module, the batch
went back into a module it had left (a closure handed down and called back,
the pattern issue 51 removed). Reading the model's settings (`TowerModel`'s
properties) is not a step of the path.
"""

import sys
import types

import numpy as np
import pytest
from keras_family import keras

import kerastower
from kerastower import _keras_compat

RNG = np.random.default_rng(11)
X = RNG.normal(size=(8, 6)).astype("float32")
Y = RNG.integers(0, 3, size=(8,))


def _ours(name: str) -> bool:
    return name.startswith("kerastower.") and not name.startswith(
        "kerastower._keras_compat"
    )


def _is_setting(code) -> bool:
    return isinstance(getattr(kerastower.TowerModel, code.co_name, None), property)


def walk(run, ours=_ours):
    """Runs `run()`; returns the modules entered, in order, and the
    re-entries ``(module left for, module re-entered, function)``."""
    entered, reentries = [], []

    def profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not ours(name) or _is_setting(frame.f_code):
            return
        if name not in entered:
            entered.append(name)
        nearest, caller = None, frame.f_back
        while caller is not None:
            other = caller.f_globals.get("__name__", "")
            if ours(other):
                nearest = nearest or other
                if other == name and nearest != name:
                    reentries.append((nearest, name, frame.f_code.co_name))
                    break
            caller = caller.f_back

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return entered, reentries


def _model(**options):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    model = kerastower.TowerModel(
        inputs, keras.layers.Dense(3)(hidden), towers=2, **options
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_the_walk_sees_a_callback_into_a_module_it_left():
    top, helper = (
        types.ModuleType("kerastower.top"),
        types.ModuleType("kerastower.helper"),
    )
    exec("def call(fn):\n    return fn()\n", helper.__dict__)
    exec(
        "def step(helper):\n"
        "    def closure():\n"
        "        return 1\n"
        "    return helper.call(closure)\n",
        top.__dict__,
    )
    _, reentries = walk(lambda: top.step(helper))
    assert reentries == [("kerastower.helper", "kerastower.top", "closure")]
    # Called on its own, the same code goes down only.
    _, reentries = walk(lambda: helper.call(lambda: 1))
    assert reentries == []


SETTINGS = [{}, {"global_batch_loss": True}]
if _keras_compat.why_no_replicas() is None:
    SETTINGS.append({"replicate_variables": True})


@pytest.mark.parametrize("options", SETTINGS, ids=lambda o: ",".join(o) or "default")
def test_a_batch_goes_down_the_package_and_back_up(options):
    model = _model(**options)
    entered, reentries = walk(
        lambda: model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    )
    assert reentries == []
    # The walk saw the step's path: the plan, the runs, the body, the sums.
    for module in ("plan", "tower_runs", "tower_context", "tower_body"):
        assert f"kerastower.step.{module}" in entered
    assert "kerastower.reduce.gradients" in entered
    _, reentries = walk(lambda: model.evaluate(X, Y, batch_size=8, verbose=0))
    assert reentries == []
    _, reentries = walk(lambda: model.predict(X, batch_size=8, verbose=0))
    assert reentries == []
