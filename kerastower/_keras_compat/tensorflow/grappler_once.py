"""One traced function, optimised by Grappler once, called on many devices.

TensorFlow instantiates a function once per device it is called on, and
runs Grappler on each instantiation: a tower function called on ``N``
devices was optimised ``N`` times (on the Transformer of `bench.trace`, 0.7
s a device, most of what its first step grew with the tower count).
`optimised_once` runs Grappler's passes on the function's body once, for
a device of the towers' type, and registers the result as a new function;
its calls then skip Grappler (`tower_calls.calls_without_graph_optimizer`).

This uses TensorFlow's own way of optimising a function's body, with no
public API: Grappler optimises every function that a graph calls
(`tf_optimizer.OptimizeGraph` on a graph of one call), and
`AtomicFunction` calls a registered ``FunctionDef``. Each hook is checked
when used: a TensorFlow change raises an error naming it.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from kerastower._keras_compat.errors import _attribute as _keras_attribute
from kerastower._keras_compat.errors import _fail_tensorflow as _fail

_names = itertools.count()


def _attribute(obj, name: str, owner: str):
    return _keras_attribute(obj, name, owner, fail=_fail)


def _modules():
    """TensorFlow's Grappler wrapper, eager context and `AtomicFunction`."""
    try:
        from tensorflow.python.eager import context
        from tensorflow.python.eager.polymorphic_function import atomic_function
        from tensorflow.python.grappler import tf_optimizer
    except ImportError as error:  # pragma: no cover - depends on TensorFlow
        raise _fail("tf_optimizer.OptimizeGraph", "cannot be imported") from error
    return context, atomic_function, tf_optimizer


# The parameters of `AtomicFunction` that `optimised_once` passes (TensorFlow
# 2.15 and later; 2.13 and 2.14 made it of other arguments).
_ATOMIC_PARAMETERS = [
    "self",
    "name",
    "bound_context",
    "function_type",
    "children",
    "call_options",
    "cached_graph",
]


def available() -> bool:
    """Whether the installed TensorFlow has the hooks of `optimised_once`."""
    try:
        _, atomic_function, _ = _modules()
    except Exception:  # noqa: BLE001 - any missing hook means no
        return False
    atomic = getattr(atomic_function, "AtomicFunction", None)
    return (
        atomic is not None
        and list(inspect.signature(atomic.__init__).parameters) == _ATOMIC_PARAMETERS
        and callable(getattr(atomic, "call_with_captures", None))
    )


def _function_names(value: Any) -> list:
    """The ``NameAttrList``s of the functions that attribute `value` names."""
    if value.HasField("func"):
        return [value.func]
    if value.HasField("list"):
        return list(value.list.func)
    return []


def _renamed(function_def: Any, names: dict[str, str]) -> None:
    """Renames `function_def` and its calls of the functions of `names`."""
    for node in function_def.node_def:
        node.op = names.get(node.op, node.op)
        for value in node.attr.values():
            for called in _function_names(value):
                called.name = names.get(called.name, called.name)
    function_def.signature.name = names[function_def.signature.name]


_STATEFUL_CALL, _CALL = "StatefulPartitionedCall", "PartitionedCall"
# The ops that call a function.
CALL_OPS = (_STATEFUL_CALL, _CALL)


def is_function_call(op: tf.Operation) -> bool:
    """Whether `op` calls a traced function."""
    return op.type in CALL_OPS


def _graph_of_one_call(atomic: Any, call_config: bytes) -> tuple[Any, list[str]]:
    """A ``GraphDef`` of one call of `atomic` on placeholders, and the names
    to fetch: the call's outputs, or the call for a function of none (an
    optimizer's update).

    Written as protos: the graph TensorFlow would build for it copies the
    function into a new graph and infers the shapes of its whole body
    (DenseNet121's tower function, 10,000 nodes: 0.24 s, which Grappler's
    round does not need). The library holds copies of `atomic`'s definition
    and its children's; the call carries `call_config` (a serialized
    ``ConfigProto``) as TensorFlow's call would.
    """
    definition = _attribute(atomic, "cached_definition", "AtomicFunction")
    children = _attribute(atomic, "children", "AtomicFunction")
    outputs = _attribute(atomic, "function_type", "AtomicFunction").flat_outputs
    stateful = _attribute(atomic, "call_options", "AtomicFunction").is_stateful
    graph_def = tf.compat.v1.GraphDef()
    graph_def.versions.producer = tf.version.GRAPH_DEF_VERSION
    graph_def.versions.min_consumer = tf.version.GRAPH_DEF_VERSION_MIN_CONSUMER
    graph_def.library.function.add().CopyFrom(definition)
    for child in children:
        graph_def.library.function.add().CopyFrom(
            _attribute(child, "cached_definition", "AtomicFunction")
        )
    call = tf.compat.v1.NodeDef(name="call", op=_STATEFUL_CALL if stateful else _CALL)
    for i, tensor in enumerate(atomic.graph.inputs):
        placeholder = graph_def.node.add(name=f"input_{i}", op="Placeholder")
        placeholder.attr["dtype"].type = tensor.dtype.as_datatype_enum
        placeholder.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
        call.input.append(placeholder.name)
        call.attr["Tin"].list.type.append(tensor.dtype.as_datatype_enum)
    call.attr["Tout"].list.type.extend(o.dtype.as_datatype_enum for o in outputs)
    call.attr["f"].func.name = definition.signature.name
    call.attr["config_proto"].s = call_config
    call.attr["executor_type"].s = b""
    graph_def.node.append(call)
    return graph_def, [f"call:{i}" for i in range(len(outputs))] or ["call"]


def _grappled(atomic: Any, device: str, passes: Sequence[str], config: Any) -> list:
    """The library of a graph that calls `atomic` once, after one round of
    Grappler's `passes`, which optimise every function it calls (`config`,
    a ``ConfigProto``, sets Grappler's other options).

    Grappler reads a node's device to choose kernels (oneDNN's fused ones
    on CPUs, layouts on GPUs): nodes without one are given `device` while
    it runs, and none after.
    """
    _, _, tf_optimizer = _modules()
    graph_def, fetch = _graph_of_one_call(atomic, config.SerializeToString())
    placed = set()
    for function_def in graph_def.library.function:
        for node in function_def.node_def:
            if node.device:
                placed.add((function_def.signature.name, node.name))
            else:
                node.device = device
    meta_graph = tf.compat.v1.MetaGraphDef(graph_def=graph_def)
    meta_graph.collection_def["train_op"].node_list.value.extend(fetch)
    options = config.graph_options.rewrite_options
    options.meta_optimizer_iterations = options.ONE
    del options.optimizers[:]  # the list replaces Grappler's default passes
    options.optimizers.extend(passes)
    optimised = tf_optimizer.OptimizeGraph(
        config, meta_graph, verbose=False, graph_id=b"tower"
    )
    for function_def in optimised.library.function:
        for node in function_def.node_def:
            if (function_def.signature.name, node.name) not in placed:
                node.device = ""
    return list(optimised.library.function)


class OptimisedFunction:
    """A concrete function whose body Grappler optimised once
    (`optimised_once`): call it as the concrete function, anywhere.

    Attributes:
        function: The concrete function it was made of.
    """

    def __init__(self, function: Any, atomic: Any):
        self.function = function
        self._atomic = atomic

    def __call__(self, *args: Any) -> Any:
        return self.call_with(args, list(self.function.captured_inputs))

    def call_with(self, args: Sequence[Any], captures: Sequence[Any]) -> Any:
        """Calls it on `args`, with `captures` in place of the function's
        captured inputs (another variable's handle in place of a captured
        one runs the same ops on that variable)."""
        call = _attribute(self._atomic, "call_with_captures", "AtomicFunction")
        return call(tuple(args), {}, list(captures))


def unseen(value: Any) -> tf.Tensor:
    """`value`, as a tensor whose value neither tracing nor Grappler sees.

    Tracing infers the static value of what it can (`tf.get_static_value`);
    Grappler folds what it can compute into constants, which each
    instantiation of a function allocates and holds for its life, and
    specialises a function for each call whose inputs are constants. A
    ``placeholder_with_default`` is none of these.

    Args:
        value: A tensor, or what `tf.convert_to_tensor` takes; its static
            shape is kept.
    """
    value = tf.convert_to_tensor(value)
    return tf.compat.v1.placeholder_with_default(value, value.shape)


def optimised_once(
    function: Any, device: str, passes: Sequence[str]
) -> OptimisedFunction:
    """`function` with its body optimised by Grappler's `passes`, once.

    Args:
        function: A `tf.types.experimental.ConcreteFunction`.
        device: A device of the type that it will be called on (Grappler
            chooses kernels by device type).
        passes: The names of Grappler's passes, in Grappler's order
            (`tower_calls.kernel_passes`); one round.

    Returns:
        An `OptimisedFunction`, called as `function` with the same
        arguments and captures. Call it under
        `tower_calls.calls_without_graph_optimizer`, or each instantiation
        is optimised again. Where Grappler is turned off
        (``disable_meta_optimizer``), its body is `function`'s.
    """
    if not available():
        raise _fail("AtomicFunction", "is missing or changed")
    context, atomic_function, _ = _modules()
    atomic = _attribute(function, "_inference_function", "ConcreteFunction")
    ctx = context.context()
    calls = _attribute(ctx, "function_call_options", "Context")
    config = tf.compat.v1.ConfigProto.FromString(calls.config_proto_serialized)
    if config.graph_options.rewrite_options.disable_meta_optimizer:
        return OptimisedFunction(function, atomic)  # Grappler turned off
    library = _grappled(atomic, device, passes, config)
    suffix = f"_optimised_once_{next(_names)}"
    names = {f.signature.name: f.signature.name + suffix for f in library}
    main = names.get(atomic.name.decode())
    if main is None:
        raise _fail("tf_optimizer.OptimizeGraph", "dropped the function it optimised")
    originals = {child.name.decode(): child for child in atomic.children}
    for function_def in library:
        _renamed(function_def, names)
        _attribute(ctx, "add_function_def", "Context")(function_def)
    new_atomic = _attribute(atomic_function, "AtomicFunction", "atomic_function")
    children = [
        # A child is only named (its calls are the parent's, in its body);
        # Grappler's specialised branches take their caller's type.
        new_atomic(name, ctx, originals.get(old, atomic).function_type)
        for old, name in names.items()
        if name != main
    ]
    return OptimisedFunction(
        function,
        new_atomic(
            main,
            ctx,
            atomic.function_type,
            children,
            _attribute(atomic, "call_options", "AtomicFunction"),
            cached_graph=function.graph,
        ),
    )
