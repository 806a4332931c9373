"""The `conftest.py` of the extracted Keras test modules (see `run.py`).

Both runs see the same files and the same four logical CPUs; only
``--tower-mode`` differs:

- ``baseline``: the modules run as Keras ships them, on `keras.Model`.
- ``swapped``: after collection, the names the modules use for `keras.Model`
  are rebound to `kerastower.TowerModel` in each module's own namespace: the
  ``Model`` global of ``model_test``, ``functional_test`` and
  ``sequential_test``, and ``keras.Model`` / ``models.Model`` in
  ``trainer_test`` (through a view of those modules). Keras's own modules are
  untouched, so Keras keeps building its internal models from `keras.Model`.

`Sequential` and `Functional` keep their Keras classes: kerastower has no
`Sequential` of its own (`TowerModel.from_model` turns a built `Sequential`
into a functional `TowerModel`, which has no ``add``/``pop``), and
``FunctionalTowerModel`` is a `Functional`, so ``assertIsInstance(model,
Functional)`` still holds for a swapped model. ``trainer_test``'s own models
mix Keras's backend ``Trainer`` into a layer (``class ExampleModel(Trainer,
layers.Dense)``); they are no `keras.Model` and keep running on Keras.

In both modes the plugin counts `TowerModel` instances and executed tower
steps (calls of ``TowerRuns.split_run`` that ran, in graph or eager mode)
and writes them to ``--tower-report``: the runner fails when a swapped run
made no `TowerModel` or ran no tower step, or a baseline run made any.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras.src import models as keras_models  # noqa: E402

import kerastower  # noqa: E402
from kerastower import TowerModel  # noqa: E402
from kerastower.step.tower_runs import TowerRuns  # noqa: E402

NUM_TOWERS = 4
kerastower.configure_logical_devices(NUM_TOWERS)

# trainer_test.py imports jax at the top but uses it only under the JAX
# backend. Without jax installed, a stand-in lets the module import; it leaves
# `sys.modules` after collection, so a test that imports jax fails as it would
# without jax (on the baseline too).
try:
    import jax  # noqa: F401
except ImportError:

    class _MissingJax(types.ModuleType):
        def __getattr__(self, name):
            raise AttributeError(f"jax is not installed (jax.{name})")

    sys.modules["jax"] = _MissingJax("jax")
    _JAX_STAND_IN = True
else:
    _JAX_STAND_IN = False

# What each module calls `keras.Model`: (global name, attribute or None).
# A name that is missing means Keras changed the module: fail, never skip.
SWAPPED_NAMES = {
    "trainer_test": [("keras", "Model"), ("models", "Model")],
    "model_test": [("Model", None)],
    "functional_test": [("Model", None)],
    "sequential_test": [("Model", None)],
}


class _ModuleView(types.ModuleType):
    """A module that answers `overrides` first and the real module otherwise."""

    def __init__(self, module: types.ModuleType, overrides: dict):
        super().__init__(module.__name__, module.__doc__)
        self._module = module
        self._overrides = overrides

    def __getattr__(self, name):
        if name in self._overrides:
            return self._overrides[name]
        return getattr(self._module, name)


class _Counters:
    """`TowerModel` instances and tower steps, counted by wrapping two hooks.

    ``__new__`` rather than ``__init__`` is wrapped, because Keras reads the
    signature of ``__init__`` (``inspect.getfullargspec``) to build configs.
    """

    def __init__(self):
        self.instances: collections.Counter = collections.Counter()
        self.traced_towers: collections.Counter = collections.Counter()
        self.tower_steps = None
        # Per test module: how many tests made a TowerModel / ran tower steps.
        self.tests_with_instances: collections.Counter = collections.Counter()
        self.tests_with_steps: collections.Counter = collections.Counter()

    def totals(self) -> tuple[int, int]:
        return sum(self.instances.values()), int(self.tower_steps.numpy())

    def install(self):
        with tf.device("/device:CPU:0"):
            self.tower_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        original_new = TowerModel.__new__
        original_split_run = getattr(TowerRuns, "split_run", None)
        if original_split_run is None:
            raise RuntimeError(
                "kerastower.step.tower_runs.TowerRuns.split_run, through which the "
                "Keras suite counts tower steps, is gone: update plugin.py."
            )
        counters = self

        def counting_new(cls, *args, **kwargs):
            instance = original_new(cls, *args, **kwargs)
            counters.instances[type(instance).__name__] += 1
            return instance

        def counting_split_run(self, *args, **kwargs):
            counters.traced_towers[self.model.num_towers] += 1
            counters.tower_steps.assign_add(1)
            return original_split_run(self, *args, **kwargs)

        TowerModel.__new__ = staticmethod(counting_new)
        TowerRuns.split_run = counting_split_run

    def as_dict(self) -> dict:
        instances, steps = self.totals()
        return {
            "tower_model_instances": instances,
            "instances_by_class": dict(self.instances),
            "tower_steps": steps,
            "traced_tower_runs_by_num_towers": {
                str(k): v for k, v in self.traced_towers.items()
            },
            "tests_making_tower_models": dict(self.tests_with_instances),
            "tests_running_tower_steps": dict(self.tests_with_steps),
        }


_COUNTERS = _Counters()


def pytest_addoption(parser):
    parser.addoption(
        "--tower-mode",
        choices=("baseline", "swapped"),
        required=True,
        help="baseline: keras.Model; swapped: kerastower.TowerModel.",
    )
    parser.addoption(
        "--tower-report", default=None, help="JSON file for the swap counters."
    )


def pytest_configure(config):
    # Registered by the conftest.py of Keras's repository, which the sdist
    # does not ship; under TensorFlow it skips nothing.
    config.addinivalue_line(
        "markers", "requires_trainable_backend: mark test for trainable backends"
    )
    _COUNTERS.install()


def _swap(module: types.ModuleType, names):
    for global_name, attribute in names:
        if not hasattr(module, global_name):
            raise pytest.UsageError(
                f"{module.__name__}.py of keras {keras.__version__} no longer "
                f"binds `{global_name}`: update SWAPPED_NAMES in the plugin."
            )
        value = getattr(module, global_name)
        if attribute is None:
            if value is not keras.Model:
                raise pytest.UsageError(
                    f"{module.__name__}.{global_name} is {value!r}, not "
                    f"keras.Model (keras {keras.__version__})."
                )
            setattr(module, global_name, TowerModel)
        else:
            if getattr(value, attribute) is not keras.Model:
                raise pytest.UsageError(
                    f"{module.__name__}.{global_name}.{attribute} is not "
                    f"keras.Model (keras {keras.__version__})."
                )
            if value is not keras and value is not keras_models:
                raise pytest.UsageError(
                    f"{module.__name__}.{global_name} is {value!r}, not the "
                    f"keras or keras.src.models module."
                )
            setattr(module, global_name, _ModuleView(value, {attribute: TowerModel}))


def pytest_collection_modifyitems(session, config, items):
    modules = {item.module.__name__: item.module for item in items}
    if config.getoption("--tower-mode") == "swapped":
        for name, module in modules.items():
            _swap(module, SWAPPED_NAMES[name])
    if _JAX_STAND_IN:
        del sys.modules["jax"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    instances, steps = _COUNTERS.totals()
    try:
        return (yield)
    finally:
        after_instances, after_steps = _COUNTERS.totals()
        module = item.module.__name__
        if after_instances > instances:
            _COUNTERS.tests_with_instances[module] += 1
        if after_steps > steps:
            _COUNTERS.tests_with_steps[module] += 1


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--tower-report")
    if path:
        report = {"mode": session.config.getoption("--tower-mode")}
        report.update(_COUNTERS.as_dict())
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
