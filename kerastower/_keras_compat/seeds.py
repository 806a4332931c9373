"""Keras's global seed generator, shared with the towers' threads.

An unseeded Keras random op (``keras.random.normal(shape)`` in a layer's
``call``) draws from Keras's global `SeedGenerator`, which Keras keeps in
thread-local state and makes at the first draw, seeded from Python's
`random`. `tf.distribute.Strategy.run` traces each tower in a thread of its
own: there each tower would make a generator of its own, which fails inside
the strategy's replica context (stock `MirroredStrategy` fails on such a
layer too). So the generator is shared: before a step function traces, a
generator is made in reserve, seeded as Keras would seed its own
(`prepare_global_seeds`; made while tracing, a variable would make the
function trace twice); the step lends it, or Keras's own, to every tower
(`global_seeds`, `GlobalSeeds.in_tower`), and towers after the first read
its state moved by their index, like a layer's seed generator
(`kerastower.step.layer_updates`). If a tower drew from the reserve, it
becomes Keras's global generator, as one device's first draw makes one;
if none did, Keras's state and Python's `random` are as one device leaves
them.

Keras 2 has no global seed generator (its unseeded random ops are
TensorFlow's): there `global_seeds` shares nothing.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

import tensorflow as tf

from kerastower._keras_compat.errors import check_callables, check_method
from kerastower._keras_compat.family import KERAS_FAMILY

# The key of the generator in Keras's thread-local global state.
_KEY = "global_seed_generator"


class GlobalSeeds:
    """Keras's global generator for the towers of one step.

    Attributes:
        variables: The generator's state variable, in a list (empty without
            a generator: Keras 2).
        drawn: Whether a tower drew from it.
    """

    def __init__(self, generator=None, global_state=None):
        self._generator = generator
        self._global_state = global_state
        self.variables = [] if generator is None else [generator.state]
        self.drawn = False

    @contextlib.contextmanager
    def in_tower(self) -> Iterator[None]:
        """Makes the generator the current thread's global one while open."""
        if self._generator is None:
            yield
            return
        before = self._global_state.get_global_attribute(_KEY)
        self._global_state.set_global_attribute(_KEY, _Noted(self._generator, self))
        try:
            yield
        finally:
            self._global_state.set_global_attribute(_KEY, before)


class _Noted:
    """The global generator as a tower sees it: notes that it drew."""

    def __init__(self, generator, seeds: GlobalSeeds):
        self._generator = generator
        self._seeds = seeds

    def next(self, ordered=True):
        self._seeds.drawn = True
        return self._generator.next(ordered)

    def __getattr__(self, name):
        return getattr(self._generator, name)


def _keras_modules():
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    check_callables(
        global_state, ["get_global_attribute", "set_global_attribute"], "global_state"
    )
    check_callables(seed_generator, ["make_default_seed"], "seed_generator")
    check_method(
        seed_generator.SeedGenerator, "next", ["self", "ordered"], "SeedGenerator"
    )
    return global_state, seed_generator


class _Reserve(threading.local):
    """A generator made before the step traces, seeded as Keras's would be.

    Attributes:
        generator: The `SeedGenerator`, or ``None``.
        before: Python's `random` state it was seeded from.
        after: That state after seeding, as Keras's seeding leaves it.
    """

    generator = None
    before = None
    after = None


_RESERVE = _Reserve()


def prepare_global_seeds() -> None:
    """Makes a generator in reserve for the step about to be traced.

    Call it eagerly, before a step function traces (``make_train_function``
    and its kin): a variable made while a `tf.function` traces makes it trace
    twice. The reserve is seeded as Keras would seed its global generator now,
    from Python's `random`, whose state is then restored; it is made again
    when that state has moved. Nothing is made when Keras has a global
    generator, or on Keras 2.
    """
    if KERAS_FAMILY < 3 or tf.inside_function():
        return
    global_state, seed_generator = _keras_modules()
    before = random.getstate()
    if global_state.get_global_attribute(_KEY) is not None or _RESERVE.before == before:
        return
    # Named: an automatic name would take a number from later generators'.
    _RESERVE.generator = seed_generator.SeedGenerator(name=_KEY)
    _RESERVE.before, _RESERVE.after = before, random.getstate()
    random.setstate(before)


@contextlib.contextmanager
def global_seeds() -> Iterator[GlobalSeeds]:
    """Yields Keras's global generator for the towers opened inside.

    Open it in the step's thread, around the towers. Without a global
    generator, the reserve (`prepare_global_seeds`) is lent to the towers;
    if a tower drew from it, it becomes Keras's global generator on exit and
    Python's `random` moves on as Keras's seeding would have moved it. A step
    traced without a reserve shares no generator.

    Raises:
        KerasCompatibilityError: If Keras no longer keeps its global
            generator as this module expects.
    """
    if KERAS_FAMILY < 3:
        yield GlobalSeeds()
        return
    global_state, seed_generator = _keras_modules()
    generator = global_state.get_global_attribute(_KEY)
    lent = generator is None
    if lent:
        generator = _RESERVE.generator
        if generator is None:
            yield GlobalSeeds()
            return
    seeds = GlobalSeeds(generator, global_state)
    yield seeds
    if lent and seeds.drawn:
        global_state.set_global_attribute(_KEY, generator)
        if random.getstate() == _RESERVE.before:
            random.setstate(_RESERVE.after)
        else:  # `random` moved since: draw Keras's seed, to move it as Keras would
            seed_generator.make_default_seed()
        _RESERVE.generator = _RESERVE.before = _RESERVE.after = None
