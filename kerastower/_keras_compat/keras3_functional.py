"""Keras 3's functional-model internals, the same on either backend.

Plain Keras (``keras.src``), no backend module: the TensorFlow fence
(`kerastower._keras_compat.keras3.trainer`) and the JAX one
(`kerastower._keras_compat.jax`, which loads no TensorFlow) both load them
here, each raising its own `KerasCompatibilityError` when one is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class FunctionalInternals(NamedTuple):
    """What `TowerModel` needs to be a functional model too.

    Attributes:
        functional: ``keras.src.models.functional.Functional``.
        trainer: ``keras.src.models.model.Trainer``, whose ``__init__`` runs
            before `functional`'s, as `keras.Model` does.
        functional_init_arguments: Keras's test of whether a model's
            arguments make a functional model.
        custom_names: Keras's registered names of serializable classes, by
            class (``GLOBAL_CUSTOM_NAMES``).
    """

    functional: type
    trainer: type
    functional_init_arguments: Callable[..., bool]
    custom_names: dict[Any, str]

    def init_functional(self, model: Any, args: tuple, kwargs: dict) -> None:
        """Runs Keras's initialisers of a functional model on `model`.

        A class deriving from both `TowerModel` and `Functional` must run
        `Trainer.__init__` before `Functional.__init__`, as `keras.Model`
        does for the classes it builds.
        """
        self.trainer.__init__(model)
        self.functional.__init__(model, *args, **kwargs)

    def register_alias(self, alias: type, cls: type) -> None:
        """Saves instances of `alias` under the name `cls` is registered with.

        Keras looks a class's saved name up by the class itself; a generated
        subclass would otherwise save under a name nothing loads.
        """
        if cls in self.custom_names:
            self.custom_names[alias] = self.custom_names[cls]


def load(fail: Callable[[str, str], Exception]) -> FunctionalInternals:
    """Imports the `FunctionalInternals` of the installed Keras 3.

    Args:
        fail: Makes the error for a hook and what is wrong with it.

    Raises:
        KerasCompatibilityError: From `fail`, naming the missing hook.
    """
    try:
        from keras.src.models.functional import Functional
        from keras.src.models.model import Trainer, functional_init_arguments
        from keras.src.saving import object_registration
    except ImportError as error:  # pragma: no cover - depends on Keras
        raise fail(
            "keras.src.models.functional.Functional", "cannot be imported"
        ) from error
    names = getattr(object_registration, "GLOBAL_CUSTOM_NAMES", None)
    if not isinstance(names, dict):  # pragma: no cover - depends on Keras
        raise fail(
            "keras.src.saving.object_registration.GLOBAL_CUSTOM_NAMES", "is missing"
        )
    return FunctionalInternals(Functional, Trainer, functional_init_arguments, names)
