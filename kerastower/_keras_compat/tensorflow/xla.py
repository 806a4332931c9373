"""XLA per tower: each tower's ops compiled on its own device.

With ``jit_compile=True`` Keras wraps the whole step in one
``tf.function(jit_compile=True)``, one XLA computation that runs on one
device whatever the towers' placements. For towers, Keras makes its step
functions without XLA (`functions_without_xla`, around Keras's
``make_*_function``), and the ops each tower creates are marked for XLA
instead (`compiled_in_towers`): TensorFlow's clustering pass then compiles
each tower's forward and backward pass into XLA clusters on that tower's
device (``_XlaCompile``, as `tf.xla.experimental.jit_scope` marks ops; one
``_XlaScope`` per tower), while the sums across towers and workers, made
outside the towers' threads or by collective ops, stay outside XLA.

`tf.xla.experimental.jit_scope` itself cannot serve: it sets the graph's
attribute scope, which every thread of `tf.distribute.Strategy.run` shares,
so the towers' scopes would overwrite each other. One scope is opened around
all towers here, whose values are decided per op, from the thread's replica
context (``Graph._attr_scope`` takes a callable per attribute).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from kerastower._keras_compat.errors import _attribute, _fail, _fail_tensorflow

# Ops that must meet the other towers' at run time: never inside a cluster.
_UNCOMPILED = frozenset(
    {
        "CollectiveReduceV2",
        "CollectiveGatherV2",
        "CollectiveBcastSendV2",
        "CollectiveBcastRecvV2",
        "CollectiveAllToAllV2",
        "CollectiveReduceScatterV2",
        "CollectiveInitializeCommunicator",
        "CollectiveAssignGroupV2",
        "NcclAllReduce",
    }
)


@contextlib.contextmanager
def functions_without_xla(model: Any) -> Iterator[None]:
    """Makes Keras build `model`'s step functions without XLA while open.

    Keras reads ``model.jit_compile`` when it makes a step function; the
    model's own setting is back when the step traces, which then compiles
    each tower (`compiled_in_towers`).

    Raises:
        KerasCompatibilityError: If Keras keeps the setting elsewhere than
            ``model._jit_compile``.
    """
    if not model.jit_compile:
        yield
        return
    if _attribute(model, "_jit_compile", "Trainer") is not True:
        raise _fail("Trainer._jit_compile", "does not hold `jit_compile`")
    model._jit_compile = False
    try:
        yield
    finally:
        model._jit_compile = True


_seen = threading.local()  # this thread's replica context and its tower


def _in_tower(strategy: tf.distribute.Strategy) -> int | None:
    """The tower whose thread is running, in `strategy`; else ``None``.

    Asked for every op a tower makes: the tower is read once per replica
    context (reading it makes a constant op, itself asked about here).
    """
    if getattr(_seen, "reading", False):
        return None  # the replica id's own constant, made below
    if not tf.distribute.has_strategy() or tf.distribute.get_strategy() is not strategy:
        return None
    context = tf.distribute.get_replica_context()
    if context is None:  # a merge call: the sum across towers
        return None
    cached = getattr(_seen, "tower", None)
    if cached is not None and cached[0] is context:
        return cached[1]
    _seen.reading = True
    try:
        tower = int(tf.get_static_value(context.replica_id_in_sync_group))
    finally:
        _seen.reading = False
    _seen.tower = (context, tower)
    return tower


def compiled_in_towers(strategy: tf.distribute.Strategy):
    """Marks for XLA every op that a tower of `strategy` creates while open.

    Open it around `tf.distribute.Strategy.run` of the towers, in a traced
    step. Each tower's ops get ``_XlaCompile`` and a scope of their own
    (``kerastower_tower_<i>``), so no cluster spans two towers; ops made in a
    merge call, and collective ops, are left to TensorFlow's executor.

    Raises:
        KerasCompatibilityError: If the graph has no ``_attr_scope``.
    """
    graph = tf.compat.v1.get_default_graph()
    scope = getattr(graph, "_attr_scope", None)
    if not callable(scope):
        raise _fail_tensorflow("Graph._attr_scope", "is missing")

    def compile_attr(node_def):
        if node_def.op in _UNCOMPILED or _in_tower(strategy) is None:
            return None
        return attr_value_pb2.AttrValue(b=True)

    def scope_attr(node_def):
        tower = None if node_def.op in _UNCOMPILED else _in_tower(strategy)
        if tower is None:
            return None
        return attr_value_pb2.AttrValue(s=f"kerastower_tower_{tower}".encode())

    return scope({"_XlaCompile": compile_attr, "_XlaScope": scope_attr})
