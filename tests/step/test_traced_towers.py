"""The tower traced once and called on every tower (issue 34)."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from oracle import assert_close, assert_same_history, assert_same_weights, twin

import kerastower

try:  # the test reads which graph optimisation a step function runs with
    from tensorflow.python.eager import context
except ImportError:  # pragma: no cover - depends on TensorFlow
    context = None


class Counting(keras.layers.Layer):
    """The identity, counting how often its ``call`` is traced."""

    calls = 0

    def call(self, x):
        Counting.calls += 1
        return x


def counting_model(
    towers=4, jit_compile=False, optimizer="adam", **kwargs
) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = keras.layers.BatchNormalization()(keras.layers.Dense(8)(inputs))
    outputs = keras.layers.Dense(1)(Counting()(h))
    if towers:
        model = kerastower.TowerModel(inputs, outputs, towers=towers, **kwargs)
    else:
        model = keras.Model(inputs, outputs)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
    return model


X = np.random.default_rng(0).normal(size=(10, 6)).astype("float32")
Y = X[:, :1] * 2.0
RUNS = {
    "train": lambda m: m.train_on_batch(X, Y),
    "test": lambda m: m.test_on_batch(X, Y),
    "predict": lambda m: m.predict_on_batch(X),
}


def traces(run, **kwargs) -> int:
    """How often the first `run` of a model called the counting layer."""
    model = counting_model(**kwargs)
    Counting.calls = 0
    RUNS[run](model)
    return Counting.calls


@pytest.mark.parametrize(
    ("run", "one_device"), [("train", 2), ("test", 1), ("predict", 1)]
)
def test_every_step_traces_the_model_once_for_all_towers(run, one_device):
    # Each step's trace calls the model once for all 4 towers and for a
    # batch smaller than the towers, where towers traced one by one called it
    # 5 times (6 for the training step measured before the change). Keras
    # builds a TowerModel's compiled loss and metrics before its first step
    # (one device does it in the step's trace); a functional model's are
    # built from its graph, without a call (one more before).
    assert traces(run, towers=0) == one_device
    # Explicit: `KERASTOWER_REPLICATE_VARIABLES=1` (`nox -s replicas`) forces
    # replicas where the setting is left at "auto".
    assert traces(run, replicate_variables=False) == 1
    # With replicas (the GPU default) too: each tower passes its replicas'
    # values to the one trace.
    assert traces(run, replicate_variables=True) == 1
    # With `global_batch_loss`, whose gathered predictions sum in a group of
    # their batch size (and no second trace of the step: the run keys'
    # counter is made before it traces).
    assert traces(run, global_batch_loss=True) == 1


def test_xla_traces_one_copy_per_tower():
    assert traces("train", jit_compile=True) >= 5  # 4 towers, 1 for a small batch


@pytest.mark.parametrize("batch_size", [3, 4, 7])
def test_a_traced_tower_trains_as_one_device_on_every_batch_shape(batch_size):
    # 10 examples in batches of 3 on 4 towers: every step has a tower without
    # an example, or runs whole on the first tower (the last batch of 1).
    def build():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,))
        # No bias before BatchNormalization: its gradient would be rounding
        # noise, which Adam scales up to steps of 1e-4.
        h = keras.layers.Dense(8, use_bias=False)(inputs)
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        return keras.Model(inputs, keras.layers.Dense(1)(h))

    plain, towers = twin(build, towers=4)
    for model in (plain, towers):
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    histories = [
        m.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0).history
        for m in (plain, towers)
    ]
    assert_same_history(*histories)
    assert_same_weights(plain, towers)
    assert_close(
        towers.predict(X, batch_size=batch_size, verbose=0),
        plain.predict(X, batch_size=batch_size, verbose=0),
    )


class Rounds(keras.layers.Layer):
    """The identity, recording whether the function calls made where it is
    traced get one round of Grappler (TensorFlow's default: two), and
    whether without its function and memory optimisers (default: on)."""

    seen: list[tuple[bool, bool, bool]] = []

    def call(self, x):
        options = context.context().function_call_options
        config = tf.compat.v1.ConfigProto.FromString(options.config_proto_serialized)
        rewrite = config.graph_options.rewrite_options
        Rounds.seen.append(
            (
                rewrite.meta_optimizer_iterations == rewrite.ONE,
                rewrite.function_optimization == rewrite.OFF,
                rewrite.memory_optimization == rewrite.NO_MEM_OPT,
            )
        )
        return x


class OwnStep(kerastower.TowerModel):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize(
    ("cls", "settings", "once"),
    [
        (kerastower.TowerModel, {"replicate_variables": False}, True),
        (kerastower.TowerModel, {"replicate_variables": True}, True),
        (kerastower.TowerModel, {"replicate_variables": False, "towers": 1}, False),
        (OwnStep, {"replicate_variables": False}, False),
    ],
    ids=["traced", "replicas", "one_tower", "own_train_step"],
)
@pytest.mark.parametrize("run", ["train", "test", "predict"])
@pytest.mark.filterwarnings("ignore:OwnStep overrides `train_step`")
def test_step_functions_get_one_round_of_grappler_where_towers_are_traced_once(
    cls, settings, once, run
):
    # A step traces inside its function's call, so the options the layer
    # sees are those the step function is called, and instantiated, with.
    # Where it calls its towers traced once, Grappler's second round found
    # nothing and took seconds, as did its function optimiser; where it
    # runs one tower or the user's own `train_step`, Keras's default stays.
    settings = {"towers": 4, **settings}
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(1)(Rounds()(inputs))
    model = cls(inputs, outputs, **settings)
    model.compile(optimizer="sgd", loss="mse")
    Rounds.seen = []
    RUNS[run](model)
    if cls is OwnStep and run != "train":
        once = True  # its test and predict steps are TowerModel's
    assert Rounds.seen[-1] == (once, once, once)
    # The wrapper copies, as Keras's own function does.
    assert callable(copy.copy(getattr(model, f"{run}_function")))


def _conditional_inputs(function: tf.types.experimental.ConcreteFunction) -> list[int]:
    """The data inputs of every conditional in `function`'s graph and the
    functions it traced.

    Not of the tower function's body once Grappler optimised it
    (`optimised_once`): its passes may move a branch's inputs into it (a
    bucket of gradients, packed in the branch that sums it), which costs
    the trace nothing.
    """
    graph_def = function.graph.as_graph_def()
    nodes = list(graph_def.node)
    for library_function in graph_def.library.function:
        if "_optimised_once_" not in library_function.signature.name:
            nodes.extend(library_function.node_def)
    return [
        sum(not name.startswith("^") for name in node.input)
        for node in nodes
        if node.op in ("If", "StatelessIf")
    ]


@pytest.mark.parametrize("replicate_variables", [False, True])
def test_no_conditional_of_a_step_takes_every_weight(replicate_variables):
    # A batch smaller than the tower count runs whole on the first tower.
    # Taking every tower's call into a conditional on it passed the calls'
    # inputs (every weight) and outputs (every gradient) through both
    # branches: ~1,700 of ResNet50's ops on 4 towers, ~13% of its first
    # step's trace. Only the loss, outputs and metrics go through one now.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    h = keras.layers.BatchNormalization()(inputs)
    for _ in range(12):
        h = keras.layers.Dense(6)(h)
    model = kerastower.TowerModel(
        inputs,
        keras.layers.Dense(1)(h),
        towers=4,
        replicate_variables=replicate_variables,
    )
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.train_on_batch(X, Y)
    specs = (tf.TensorSpec([None, 6]), tf.TensorSpec([None, 1]))
    for step in (model.train_step, model.test_step):
        traced = tf.function(lambda x, y, step=step: step((x, y)))
        inputs = _conditional_inputs(traced.get_concrete_function(*specs))
        assert inputs  # the conditional on the batch is there
        assert max(inputs) < len(model.weights), inputs
    traced = tf.function(model.predict_step)
    inputs = _conditional_inputs(traced.get_concrete_function(specs[0]))
    assert max(inputs) < len(model.weights), inputs


def _tower_input_shapes(function: tf.types.experimental.ConcreteFunction) -> set:
    """The batch sizes of the 2-d float shards of every traced tower that
    `function` calls (not the weights' values it takes too)."""
    found = set()
    for library_function in function.graph.as_graph_def().library.function:
        if "traced_tower" not in library_function.signature.name:
            continue
        for i, arg in enumerate(library_function.signature.input_arg):
            shapes = library_function.arg_attr[i].attr.get("_output_shapes")
            if (
                not arg.name.startswith("shard")
                or arg.type != tf.float32.as_datatype_enum
                or shapes is None
            ):
                continue
            dims = shapes.list.shape[0].dim
            if len(dims) == 2:
                found.add(dims[0].size)
    return found


@pytest.mark.parametrize("replicate_variables", [False, True])
def test_an_even_static_batch_traces_static_shards(replicate_variables):
    # A static batch that the towers split evenly is never smaller than the
    # tower count: the towers trace their shards' static size (no shape is
    # computed at run time) and no conditional runs the batch whole.
    model = counting_model(towers=4, replicate_variables=replicate_variables)
    model.train_on_batch(X, Y)
    conditionals = {}
    for batch in (8, None, 10):
        specs = (tf.TensorSpec([batch, 6]), tf.TensorSpec([batch, 1]))
        traced = tf.function(lambda x, y: model.train_step((x, y)))
        function = traced.get_concrete_function(*specs)
        conditionals[batch] = len(_conditional_inputs(function))
        shard = 2 if batch == 8 else -1  # -1: unknown
        assert _tower_input_shapes(function) == {shard}, batch
    # Gone: the conditional that joins the other towers' results to the
    # first's, and the 3 that pick the other towers' shards.
    assert conditionals[None] - conditionals[8] == 4, conditionals
    assert conditionals[10] == conditionals[None], conditionals


def _step_graph(model) -> tf.Graph:
    """The graph of `model`'s training step on a batch of 8."""
    specs = (tf.TensorSpec([8, 6]), tf.TensorSpec([8, 1]))
    traced = tf.function(lambda x, y: model.train_step((x, y)))
    return traced.get_concrete_function(*specs).graph


@pytest.mark.parametrize("replicate_variables", [False, True])
def test_every_tower_calls_one_function_optimised_once_and_skips_grappler(
    replicate_variables,
):
    # Grappler optimised the tower function once per device it ran on;
    # its body is optimised once now, and no call optimises it again. With
    # replicas, so is the optimizer's update that every tower calls.
    model = counting_model(replicate_variables=replicate_variables)
    model.train_on_batch(X, Y)
    graph = _step_graph(model)
    calls = [
        op
        for op in graph.get_operations()
        if op.type == "StatefulPartitionedCall"
        and "_optimised_once_" in op.get_attr("f").name
    ]
    functions = {op.get_attr("f").name for op in calls}
    assert len(functions) == (2 if replicate_variables else 1)

    def device(name):
        return tf.DeviceSpec.from_string(name).to_string()

    for function in functions:
        assert sorted(
            device(op.device) for op in calls if op.get_attr("f").name == function
        ) == sorted(device(d) for d in model.tower_devices)
    for op in calls:
        config = tf.compat.v1.ConfigProto.FromString(op.get_attr("config_proto"))
        assert config.graph_options.rewrite_options.disable_meta_optimizer
        # Nor did TensorFlow infer shapes through the body as it added the
        # call (0.077 s a call of DenseNet121's tower function).
        assert op.get_attr("_disable_call_shape_inference")


@pytest.mark.parametrize("loss_scale", [False, True])
@pytest.mark.parametrize("replicate_variables", [False, True])
def test_the_tower_function_reads_no_weight_off_its_device(
    replicate_variables, loss_scale
):
    # A tower function that read the model's weights itself ran in two parts
    # on every tower but the first, one on the first tower's device to read
    # them, each weight sent across within the call: the Transformer's steady
    # step took 1.18 times the copies design's. The step reads them, Keras's
    # seed generators' states and a loss-scale optimizer's scale once and
    # passes their values; with replicas, each tower reads its own replicas.
    optimizer = keras.optimizers.Adam()
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    model = counting_model(replicate_variables=replicate_variables, optimizer=optimizer)
    model.train_on_batch(X, Y)
    graph = _step_graph(model)
    towers = [
        f
        for f in graph.as_graph_def().library.function
        if "traced_tower" in f.signature.name
    ]
    assert towers
    resource = tf.resource.as_datatype_enum
    trainable = len(model.trainable_variables)
    for function_def in towers:
        handles = [a for a in function_def.signature.input_arg if a.type == resource]
        reads = [n for n in function_def.node_def if n.op == "ReadVariableOp"]
        if replicate_variables:  # its replicas' handles and a token
            assert len(reads) == trainable, function_def.signature.name
            assert len(handles) == trainable + 1, function_def.signature.name
        else:
            assert not reads and not handles, function_def.signature.name


def test_a_tower_that_does_not_run_adds_zeros_made_when_it_runs():
    # With replicas, a tower that does not run sums zeros in place of its
    # gradients. `tf.zeros_like` of a bucket was a constant to Grappler,
    # which folded it into the optimised tower function: every device's
    # instantiation then held the bucket's zeros for its life (ResNet50 on
    # 4 towers: 376 MB, a third of its first step's new memory).
    model = counting_model(replicate_variables=True)
    model.train_on_batch(X, Y)
    graph_def = _step_graph(model).as_graph_def()
    optimised = [
        f for f in graph_def.library.function if "_optimised_once_" in f.signature.name
    ]
    assert optimised
    gradients = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    largest = 1
    for function_def in optimised:
        for node in function_def.node_def:
            if node.op == "Const":
                dims = node.attr["value"].tensor.tensor_shape.dim
                largest = max(largest, int(np.prod([d.size for d in dims])))
    assert largest < gradients, (largest, gradients)


_REFERENCE_CHECK = """
import keras, numpy as np, kerastower
kerastower.configure_logical_devices(2)
inputs = keras.Input((6,))
model = kerastower.TowerModel(inputs, keras.layers.Dense(1)(inputs), towers=2)
model.compile(optimizer="sgd", loss="mse")
model.train_on_batch(np.ones((4, 6), "float32"), np.ones((4, 1), "float32"))
"""


@pytest.mark.skipif(
    not kerastower._keras_compat.keeps_functions_apart(),
    reason="the towers are traced one by one",
)
def test_tensorflow_takes_the_tower_calls_for_reference_variable_users():
    # TensorFlow asks of each call whether its function holds a reference
    # variable by converting the function's body, twice per tower (on
    # DenseNet121's step with 8 towers, 1.19 s of its first step). The
    # towers' calls take an input whose op settles it: the pass reports
    # the nodes it took to touch reference variables, and a Keras model
    # has none of its own.
    environment = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "xla_cluster_util=1",
    }
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE_CHECK],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(
        r"GetNodesRelatedToRefVariables\(\) found (\d+) nodes", done.stderr
    )
    assert found, done.stderr[-2000:]
    assert max(int(n) for n in found) > 0, found
