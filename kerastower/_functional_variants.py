"""The class of ``M(inputs, outputs)`` for a subclass ``M`` of `TowerModel`."""

from __future__ import annotations

from collections.abc import Callable

_FUNCTIONAL_VARIANTS: dict[type, type] = {}


def functional_variant(
    cls: type,
    functional_base: type,
    root: type,
    args,
    register_alias: Callable[[type, type], None],
) -> type:
    """The class of ``cls(inputs, outputs)`` for a subclass `cls` of `root`.

    ``M(inputs, outputs)`` for ``class M(TowerModel)`` (the keras.io pattern
    for overriding `compute_loss` or `train_step`) is an instance of a class
    deriving from both ``M`` and `functional_base` (``FunctionalTowerModel``),
    made once per ``M``; no class's bases are ever changed, where Keras would
    rewrite them. It saves and loads under ``M``'s name.

    Args:
        cls: A subclass of `root`.
        functional_base: The functional variant of `root`, deriving from
            `root` and Keras's `Functional`.
        root: The class whose subclasses get variants (`TowerModel`).
        args: The constructor's arguments, for the error message.
        register_alias: The Keras family's `register_alias`.

    Raises:
        ValueError: If `cls` defines `call`: it cannot also be built from a
            graph.
    """
    if cls is root:
        return functional_base
    if cls not in _FUNCTIONAL_VARIANTS:
        if any("call" in vars(base) for base in cls.__mro__[: cls.__mro__.index(root)]):
            raise ValueError(
                f"{cls.__name__} subclasses {root.__name__} and defines `call`; "
                "it cannot also be built from `inputs` and `outputs`. Build it "
                f"without them, or drop `call`. Received: args={args!r}"
            )
        variant = type(
            cls.__name__,
            (cls, functional_base),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        register_alias(variant, cls)
        _FUNCTIONAL_VARIANTS[cls] = variant
    return _FUNCTIONAL_VARIANTS[cls]
