"""Keras 2's private modules, wherever its release keeps them."""

from __future__ import annotations

import importlib
from types import ModuleType

from kerastower._keras_compat.errors import _fail
from kerastower._keras_compat.family import KERAS_DISTRIBUTION


def internal(path: str, *names: str) -> ModuleType:
    """The Keras 2 module ``<keras>.src.<path>`` (``<keras>.<path>`` on 2.12).

    Args:
        path: The module below the package, e.g. ``"engine.functional"``.
        *names: Attributes the module must have.

    Raises:
        KerasCompatibilityError: If the module cannot be imported or lacks
            one of `names`.
    """
    package = KERAS_DISTRIBUTION
    for prefix in (f"{package}.src.", f"{package}."):
        try:
            module = importlib.import_module(prefix + path)
        except ImportError:
            continue
        for name in names:
            if getattr(module, name, None) is None:
                raise _fail(f"{prefix}{path}.{name}", "is missing")
        return module
    raise _fail(f"{package}.src.{path}", "cannot be imported")
