"""Calling one traced tower function on every tower's device.

A step that traces its tower's forward and backward pass once and calls the
function under each tower's device (not inlined) needs these of
TensorFlow, which it has no public API for (see `bench/trace_once.py`):

- `run_independently`: automatic control dependencies chain the stateful
  ops of a traced function in program order, and a call of a function that
  holds collectives is stateful without touching a resource. The towers'
  calls would run one after the other, and the first tower's collective
  would wait forever for towers that cannot start.
- `calls_without_graph_optimizer`: each call is instantiated on its device,
  and Grappler optimises the function once per instantiation: on ResNet50
  with 4 towers, most of the first step's time. The function's body gets
  one round of the passes that speed up kernels (`kernel_passes`) once
  instead (`grappler_once`). The step that holds the calls gets one round
  of Grappler, not two, and no function optimiser (`OptimisedOnce`).
- `calls_without_shape_inference` and `skip_reference_variable_check`:
  TensorFlow infers shapes through the function's body as it adds each
  call to the step, and converts the body twice per call, every time the
  step is instantiated, to learn that it holds no reference variable.

Each hook is checked when used: a TensorFlow change raises an error naming
it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

from kerastower._keras_compat.errors import _attribute as _keras_attribute
from kerastower._keras_compat.errors import _fail_tensorflow as _fail
from kerastower._keras_compat.tensorflow import grappler_once


def _attribute(obj, name: str, owner: str):
    return _keras_attribute(obj, name, owner, fail=_fail)


def run_independently(op: tf.Operation) -> None:
    """Exempts `op` from the automatic control dependencies of the traced
    function it is in: it is neither ordered after nor before other stateful
    ops, and still runs.

    Later reads of what `op` writes must depend on its outputs explicitly.

    Raises:
        ValueError: Outside a `tf.function` being traced.
    """
    manager = _attribute(op.graph, "experimental_acd_manager", "FuncGraph")
    if manager is None:
        raise ValueError(
            "`run_independently` orders ops of a `tf.function` being traced. "
            f"Received: an op of {op.graph!r}"
        )
    _attribute(manager, "run_independently", "AutomaticControlDependencies")(op)


def resource_barrier(resources: Sequence[tf.Tensor]) -> tf.Operation:
    """An op of the `tf.function` being traced that reads `resources`
    (resource handles) and does nothing else.

    Automatic control dependencies run it after the last op that wrote to
    any of them, and the next writes after it: it orders ops taken out of
    those dependencies (`run_independently`) that touch the resources.
    Give them a control input from it, and it one from them.

    One ``IdentityN`` op per device, of the handles of its resources, their
    inputs marked read-only as TensorFlow marks a function call's that it
    finds only read; one ``NoOp`` after them is returned. A barrier
    function of the thousand handles took 0.3 s to trace and call (ResNet50
    on 8 towers with replicas, 0.55 s of the first step; now 0.37 s, most
    of it capturing the handles, which the towers' calls then reuse).
    """
    utils = _acd_utils()
    attribute = _attribute(utils, "READ_ONLY_RESOURCE_INPUTS_ATTR", "utils")
    by_device: dict[str, list[tf.Tensor]] = {}
    for resource in resources:
        by_device.setdefault(resource.device, []).append(resource)
    barriers = []
    for device, handles in by_device.items():
        with tf.device(device):  # no handle crosses devices
            op = tf.raw_ops.IdentityN(input=handles)[0].op
        _attribute(op, "_set_attr", "Operation")(
            attribute,
            tf.compat.v1.AttrValue(
                list=tf.compat.v1.AttrValue.ListValue(i=range(len(handles)))
            ),
        )
        reads, writes = utils.get_read_write_resource_inputs(op)
        if writes or not reads:
            raise _fail(
                "auto_control_deps_utils.get_read_write_resource_inputs",
                "does not read an op's inputs marked read-only as reads",
            )
        barriers.append(op)
    with tf.control_dependencies(barriers):
        return tf.no_op()  # one op for the caller (`tf.group` adds one per device)


def _acd_utils():
    try:
        from tensorflow.python.framework import auto_control_deps_utils
    except ImportError as error:  # pragma: no cover - depends on TensorFlow
        raise _fail(
            "tensorflow.python.framework.auto_control_deps_utils", "cannot be imported"
        ) from error
    _attribute(auto_control_deps_utils, "get_read_write_resource_inputs", "utils")
    return auto_control_deps_utils


def orders_calls_here() -> bool:
    """Whether `run_independently` can order the ops made here, now.

    Inside a `tf.function` being traced; not in the body of a loop that it
    traces (Keras 2 runs ``steps_per_execution`` steps in a `tf.while_loop`),
    whose graph has no automatic control dependencies to take ops out of.
    """
    graph = tf.compat.v1.get_default_graph()
    return getattr(graph, "experimental_acd_manager", None) is not None


def _context_module():
    try:
        from tensorflow.python.eager import context
    except ImportError as error:  # pragma: no cover - depends on TensorFlow
        raise _fail("tensorflow.python.eager.context", "cannot be imported") from error
    _attribute(context, "FunctionCallOptions", "tensorflow.python.eager.context")
    return context


@contextmanager
def _call_options(edit: Callable[[Any], None]) -> Iterator[None]:
    """Function calls made while open (traced or eager) are instantiated
    with the current ``config_proto``'s rewrite options edited by `edit`."""
    context = _context_module()
    ctx = context.context()
    saved = _attribute(ctx, "function_call_options", "Context")
    config = tf.compat.v1.ConfigProto.FromString(saved.config_proto_serialized)
    edit(config.graph_options.rewrite_options)
    ctx.function_call_options = context.FunctionCallOptions(config_proto=config)
    try:
        yield
    finally:
        ctx.function_call_options = saved


def calls_without_graph_optimizer():
    """Function calls traced while open skip Grappler when instantiated.

    The calls' ``config_proto`` is the current one with the meta optimizer
    off; the function that traces them is optimised as before.
    """

    def edit(options):
        options.disable_meta_optimizer = True

    return _call_options(edit)


@contextmanager
def calls_without_shape_inference() -> Iterator[None]:
    """Function calls traced into the current graph while open skip shape
    inference through the function's body.

    Adding a call op to a graph, TensorFlow infers its outputs' shapes by
    inferring those of every op of the function: 0.077 s a call of
    DenseNet121's tower function, 0.039 s without (8 calls of `bench.trace`,
    the call ops' creation timed). `tf.function` then sets the function's
    own output shapes on the call's outputs, as precise. The call ops get
    ``_disable_call_shape_inference``, the attribute that TensorFlow's own
    `Defun` calls have.
    """
    graph = tf.compat.v1.get_default_graph()
    create = _attribute(graph, "_create_op_internal", "Graph")
    signature = inspect.signature(create)
    if not {"op_type", "attrs"} <= set(signature.parameters):
        raise _fail("Graph._create_op_internal", "takes no `op_type` and `attrs`")

    def create_call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments["op_type"] in grappler_once.CALL_OPS:
            bound.arguments["attrs"] = {
                **(bound.arguments.get("attrs") or {}),
                "_disable_call_shape_inference": tf.compat.v1.AttrValue(b=True),
            }
        return create(*bound.args, **bound.kwargs)

    graph._create_op_internal = create_call
    try:
        yield
    finally:
        del graph._create_op_internal


def kernel_passes(devices: Sequence[str]) -> tuple[str, ...]:
    """Grappler's passes that speed up the kernels of a function called on
    `devices`, in Grappler's own order.

    Dead ops pruned, identical ops made one, constants folded, arithmetic
    simplified, ops fused (a convolution with its bias and activation, a
    layer normalisation), control edges dropped, and where a device is a
    GPU, layouts made its own (NCHW convolutions); not the function, loop
    and memory optimisers and the others, which found nothing more to speed
    up in a tower's function. Identical ops made one (as Grappler does to
    the plain model's step) left ResNet50's tower function of 4,622 nodes,
    not 6,297 (1,829 constants of 158 values), and each device instantiates
    it: with 8 towers, the first step ran 1.4 s less.
    """
    on_gpu = any(tf.DeviceSpec.from_string(d).device_type == "GPU" for d in devices)
    layout = ("layout",) if on_gpu else ()
    return (
        "pruning",
        "common_subgraph_elimination",
        "constfold",
        "arithmetic",
        *layout,
        "remap",
        "dependency",
    )


class OptimisedOnce:
    """Calls `function` (a Keras step function) with one round of Grappler,
    without its function and memory optimisers.

    Grappler runs its passes twice by default; on a step that holds traced
    towers, the second round finds nothing, but its function optimiser
    instantiates the tower function again for every call that it might
    inline (on DenseNet121 with 4 towers, the first step took 24.6 s with
    two rounds, 20.5 s with one, and a fit's steps as long). In the one
    round left, its function optimiser still made every call's body, only
    to find it marked ``_noinline``, and specialised none (its log): on
    DenseNet121, 1.16 s of Grappler's 2.3 s with 4 towers, 1.86 s with 8;
    it is off. So is its memory optimiser, which changed no node of the
    step around the calls and took 0.15 s of DenseNet121's first step on 4
    towers, 0.35 s on 8 (its log). TensorFlow's runtime has inlined every
    other call and lowered the control flow before Grappler runs. Grappler
    stays on: turned off, the steps of a fit took up to 17% longer (the
    Transformer of `bench.trace`). Other attributes are `function`'s.
    """

    def __init__(self, function: Callable):
        self.function = function

    def __call__(self, *args, **kwargs):
        def edit(options):
            options.meta_optimizer_iterations = options.ONE
            options.function_optimization = options.OFF
            options.memory_optimization = options.NO_MEM_OPT

        with _call_options(edit):
            return self.function(*args, **kwargs)

    def __getattr__(self, name: str):
        if name == "function":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.function, name)


class _TracedTowerContext(tf.distribute.ReplicaContext):
    """A replica context whose replica id is a tensor and whose all-reduce
    sums over the calls of a traced tower function."""

    def __init__(self, strategy, tower: tf.Tensor, sum_fn):
        super().__init__(strategy, replica_id_in_sync_group=tower)
        self._sum_fn = sum_fn

    def all_reduce(self, reduce_op, value, options=None):
        del options
        if reduce_op != tf.distribute.ReduceOp.SUM:
            raise ValueError(
                "A traced tower only sums over the towers. "
                f"Received: reduce_op={reduce_op}"
            )
        flat = tf.nest.flatten(value)
        return tf.nest.pack_sequence_as(value, self._sum_fn(flat))

    def merge_call(self, merge_fn, args=(), kwargs=None):
        raise ValueError(
            "A traced tower cannot enter the cross-replica context "
            f"(`merge_call`). Received: merge_fn={merge_fn!r}"
        )


@contextmanager
def tower_replica_context(strategy, tower: tf.Tensor, sum_fn) -> Iterator[None]:
    """While open, `tf.distribute.get_replica_context()` is tower `tower`'s
    of `strategy` (a tensor replica id) and its ``all_reduce`` is `sum_fn`.

    For the body of a tower function traced once: the step's code reads the
    calling tower from the replica context and sums over the towers with its
    all-reduce.
    """
    context = _TracedTowerContext(strategy, tower, sum_fn)
    _attribute(context, "__enter__", "ReplicaContext")
    with context:
        yield


# An op with a reference output (a TensorFlow 1 variable).
_REFERENCE_OP = "VariableV2"


def _reference_op() -> str:
    try:
        from tensorflow.python.framework import op_def_registry
    except ImportError as error:  # pragma: no cover - depends on TensorFlow
        raise _fail("op_def_registry", "cannot be imported") from error
    op_def = _attribute(op_def_registry, "get", "op_def_registry")(_REFERENCE_OP)
    if op_def is None or not any(arg.is_ref for arg in op_def.output_arg):
        raise _fail(_REFERENCE_OP, "is not an op with a reference output")
    return _REFERENCE_OP


def skip_reference_variable_check(tensor: tf.Tensor) -> None:
    """Spares the calls that take `tensor` TensorFlow's check for reference
    variables in the function they call.

    Every time a function is instantiated, one of TensorFlow's graph passes
    (XLA's ``EncapsulateSubgraphsPass``, which runs without XLA too) marks
    the nodes that touch TensorFlow 1 reference variables. It asks of every
    function call whether the callee holds one by converting the callee's
    body to a graph on a runtime of its own, once in each direction of its
    search: two conversions of the tower function per tower, one after the
    other. A node that names an op with a reference output in one of its
    attributes settles the question for the nodes after it, calls
    included, which it then takes to touch reference variables; that only
    tells XLA clusters made by auto-clustering to keep their variables
    locked while they run, the cautious way, and the step has none. The
    attribute is set on `tensor`'s op, which must be one the caller made.

    The pass on the step of DenseNet121 (`bench.trace`) took 0.61 s with 4
    towers and 1.19 s with 8, 1.36 s with 8 replicas; with the attribute,
    0.09, 0.12 and 0.08 s (its log's timestamps).
    """
    name = "_kerastower_reference_check"
    value = tf.compat.v1.AttrValue(func=tf.compat.v1.NameAttrList(name=_reference_op()))
    _attribute(tensor.op, "_set_attr", "Operation")(name, value)


def _accepts_noinline() -> bool:
    try:
        tf.function(lambda: None, experimental_attributes={"_noinline": True})
    except ValueError:  # "_noinline is not supported by tf.function"
        return False
    return True


# TensorFlow 2.12 refuses ``_noinline`` on a `tf.function`, and 2.13 and 2.14
# have other `AtomicFunction`s than `grappler_once` calls: there the towers
# are traced one by one (`kerastower.step.traced_towers.applies`).
NOINLINE_FUNCTIONS = _accepts_noinline() and grappler_once.available()


def keeps_functions_apart() -> bool:
    """Whether a `tf.function` can be kept from inlining (``_noinline``) and
    optimised once (`grappler_once`), so that towers can call one traced
    function: from TensorFlow 2.15."""
    return NOINLINE_FUNCTIONS


def call_with_captures(function: Any, inputs: list, replace: dict[int, Any]) -> Any:
    """Calls the concrete `function` with other variables than it captured.

    A traced function reads and writes each variable it uses through the
    variable's resource handle, an input that the call passes after its own
    (`captured_inputs`). Passing another variable's handle in its place runs
    the same ops on that variable, where it lives.

    Args:
        function: A `tf.types.experimental.ConcreteFunction`.
        inputs: Its inputs, flat (composite tensors expanded).
        replace: Maps the ``id`` of a captured handle to the handle to pass
            instead; the other captures are passed as they are.

    Returns:
        What the call returns, structured as `function`'s outputs.
    """
    captured = list(function.captured_inputs)
    expected = len(function.inputs) - len(captured)
    if len(inputs) != expected:
        raise ValueError(
            f"`inputs` must hold the function's {expected} inputs, flat. "
            f"Received: {len(inputs)} inputs"
        )
    call_flat = _attribute(function, "_call_flat", "ConcreteFunction")
    return call_flat(list(inputs), [replace.get(id(c), c) for c in captured])
