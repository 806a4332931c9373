"""The step functions Keras makes for a `TowerModel`, in either Keras family.

Keras makes one function per step kind (``make_train_function``, ...) and
traces the step in it. With towers, XLA compiles each tower instead of the
whole step (`kerastower._keras_compat.tensorflow.xla`), and a step that calls its towers
traced once gets one round of Grappler (`tower_calls.OptimisedOnce`). A step
traces the model once per tower: `warn_once` keeps its warnings to one each.
Keras's global seed generator (`seeds.prepare_global_seeds`) and the
variables the model's steps would make while tracing
(``_prepare_step_variables``) are made before the step traces.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable

from kerastower._keras_compat import seeds
from kerastower._keras_compat.tensorflow import tower_calls, xla


class StepFunctionHooks:
    """`TowerModel`'s overrides of Keras's ``make_*_function``.

    Both Keras families name them alike; the model decides through
    ``num_towers`` and ``_step_optimised_once(step)``, and hears of each new
    function through ``_step_function_made(step)``.
    """

    # What the model that mixes this in provides (`TowerModel`).
    num_towers: int
    _step_optimised_once: Callable[[str], bool]
    _prepare_step_variables: Callable[[], None]
    _step_function_made: Callable[[str], None]

    # With towers, XLA compiles each tower (`xla.compiled_in_towers`), not
    # the step that holds them all.
    def make_train_function(self, force=False):
        before = self.train_function
        with self._step_functions():
            made = super().make_train_function(force)
        if self.train_function is not before:
            self._step_function_made("train_step")
        self.train_function = self._outer_step(self.train_function, "train_step")
        return made

    def make_test_function(self, force=False):
        before = self.test_function
        with self._step_functions():
            made = super().make_test_function(force)
        if self.test_function is not before:
            self._step_function_made("test_step")
        self.test_function = self._outer_step(self.test_function, "test_step")
        return made

    def make_predict_function(self, force=False):
        with self._step_functions():
            made = super().make_predict_function(force)
        self.predict_function = self._outer_step(self.predict_function, "predict_step")
        return made

    def _outer_step(self, function, step: str):
        # Where the step calls its towers traced once, one round of Grappler
        # (`_step_optimised_once`).
        if (
            function is None
            or isinstance(function, tower_calls.OptimisedOnce)
            or not self._step_optimised_once(step)
        ):
            return function
        return tower_calls.OptimisedOnce(function)

    def _step_functions(self):
        # Before Keras traces the step: a variable made while tracing would
        # make it trace twice.
        seeds.prepare_global_seeds()
        self._prepare_step_variables()
        if self.num_towers > 1:
            return xla.functions_without_xla(self)
        return contextlib.nullcontext()


def warn_once(caught, shown: frozenset = frozenset()) -> frozenset:
    """Re-raises recorded warnings, each distinct one once, except `shown`.

    Towers trace the model once each; TensorFlow prefixes names with the
    tower (``replica_1/...``), which is ignored when comparing. Returns the
    keys of the warnings shown, for a later call's `shown`.
    """
    seen = set(shown)
    for record in caught:
        text = re.sub(r"replica_\d+/", "", str(record.message))
        key = (record.category, text, record.filename, record.lineno)
        if key not in seen:
            seen.add(key)
            warnings.warn_explicit(
                record.message, record.category, record.filename, record.lineno
            )
    return frozenset(seen)


def warnings_shown_at_build(model) -> frozenset:
    """The warnings `TrainerHooks` showed while building `model` (see `warn_once`)."""
    return getattr(model, "_shown_warnings", frozenset())
