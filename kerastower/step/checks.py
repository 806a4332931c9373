"""Configurations that a step split over towers cannot train as asked.

Each that cannot train exactly is refused with an error that says what to
change, rather than trained into a model that differs from one device's; one
that trains exactly but not on every tower's device gets a warning.
"""

from __future__ import annotations

import warnings
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras


def check_no_strategy_scope() -> None:
    """Refuses to build a `TowerModel` inside a `tf.distribute` scope.

    A model built in ``strategy.scope()`` gets the strategy's variables and
    Keras distributes its steps over the strategy's replicas, on top of the
    towers' own split; the two cannot combine.

    Raises:
        ValueError: If a strategy's scope is active.
    """
    if tf.distribute.has_strategy():
        raise ValueError(
            "TowerModel splits its steps over its towers itself, so it must "
            "not be built inside a `tf.distribute` strategy's scope: build it "
            "outside `strategy.scope()`, as for one device. To train over "
            "several machines, pass the strategy instead: "
            "`TowerModel(..., strategy=strategy)`. Received: "
            f"strategy={tf.distribute.get_strategy()!r}"
        )


def check_optimizer(optimizer: Any) -> None:
    """Refuses the optimizer's own gradient accumulation.

    Keras's ``gradient_accumulation_steps=k`` weights every micro-batch
    ``1/k`` whatever its size; `kerastower.callbacks.GradientAccumulation`
    weights micro-batch ``j`` by ``n_j / sum_j n_j``, as one large batch does.

    Raises:
        ValueError: If ``optimizer.gradient_accumulation_steps`` is set.
    """
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "TowerModel does not support the optimizer's own "
            "`gradient_accumulation_steps`: it weights every micro-batch "
            "1/k whatever its size. Use the exact "
            "`kerastower.callbacks.GradientAccumulation(steps)` callback "
            "instead. Received: gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}"
        )


def check_no_stateful_layers(model: Any) -> None:
    """Refuses layers that keep state per example across batches.

    A stateful RNN (``stateful=True``) holds one state row per example of a
    fixed batch and carries it to the same row of the next batch; a tower
    sees only its shard of the rows, so the batch cannot be split.

    Raises:
        ValueError: If a layer of `model` has ``stateful=True``.
    """
    for layer in _keras_compat.inner_layers(model):
        if getattr(layer, "stateful", False) is True:
            raise ValueError(
                f"Layer {layer.name!r} is stateful: it keeps one state per "
                "example of a fixed batch, which cannot be split across "
                f"towers. Use `towers=1`, or `stateful=False`. Received: "
                f"towers={model.num_towers} with stateful=True"
            )


def warn_if_trainable_assigned(paths: list[str]) -> None:
    """Warns that the forward pass assigns trainable weights of the model.

    A layer that assigns a trainable weight while it trains, then reads it
    (as `SpectralNormalization`, which kerastower runs once per step, does),
    is run by every tower in turn: each tower after the first reads what the
    first one assigned and applies its assignment again, so the weights it
    differentiates may not be one device's.

    Args:
        paths: The paths of the trainable weights a tower assigned.
    """
    warnings.warn(
        "The training forward pass assigns the trainable weights "
        f"{paths}. Each tower after the first reads the value the first "
        "tower assigned and assigns again, so training may differ from one "
        "device's (kerastower runs only `SpectralNormalization`'s update once "
        "per step). Assign non-trainable weights in `call`, or train with "
        "`towers=1`.",
        stacklevel=2,
    )


def refuse_assigned_weights(model: Any, names: list[str]) -> None:
    """Refuses a Keras 2 forward pass that assigns the model's weights.

    Keras 2 has no scope that holds a tower's assignments (Keras 3's
    `keras.StatelessScope`): every tower would make the assignment in turn,
    a counter advance once per tower, a running sum add every tower's shard
    to what the towers before it left. kerastower updates `BatchNormalization`
    and `SpectralNormalization` once per step itself.

    Raises:
        ValueError: Always, naming the weights.
    """
    raise ValueError(
        f"The forward pass assigns the model's weights {names}. On Keras 2 "
        "every tower would make that assignment again, and the model would "
        "differ from one device's (kerastower updates only `BatchNormalization` "
        "and `SpectralNormalization` once per step there). Train it with "
        "`towers=1`, or on Keras 3, whose towers hold their assignments. "
        f"Received: towers={model.num_towers}"
    )


def warn_if_state_kept(paths: list[str]) -> None:
    """Warns that non-trainable weights keep the first tower's assignment.

    A layer may assign a non-trainable weight in its forward pass. One device
    assigns it once per step, from the whole batch. Towers make the first
    tower's assignment, from its shard: right for a counter or anything that
    does not depend on the examples, wrong for a sum or an average over the
    batch. A weight made with ``add_weight(aggregation="sum")`` gets the sum
    of every tower's increment instead, one device's running sum.

    Args:
        paths: The paths of the weights.
    """
    warnings.warn(
        f"The forward pass assigns the non-trainable weights {paths}. Towers "
        "keep the first tower's assignment, made from its shard of the batch: "
        "one device's value for a counter, not for a sum over the batch. "
        "Create a weight that sums over the batch with `add_weight(..., "
        'aggregation="sum")` (the towers then add their increments), and one '
        'that is right as it is with `aggregation="only_first_replica"`.',
        stacklevel=2,
    )


def check_no_overwritten_gradients(model: keras.Model, variables: list) -> None:
    """Refuses variables whose "gradient" is their next value, on towers.

    float8 training (``model.quantize("float8")``) keeps scales and amax
    histories in variables made with ``overwrite_with_gradient=True``: the
    optimizer assigns the gradient instead of applying it. Towers sum their
    gradients, so every scale would become ``N`` times one device's and
    every amax history the towers' sum instead of the batch's maximum.

    Raises:
        ValueError: If a variable of `variables` has
            ``overwrite_with_gradient`` set and the step runs on several
            towers or workers.
    """
    overwritten = [
        v.path for v in variables if getattr(v, "overwrite_with_gradient", False)
    ]
    if overwritten:
        raise ValueError(
            "Towers sum their gradients, and the variables "
            f"{overwritten[:3]}{' ...' if len(overwritten) > 3 else ''} take "
            "their gradient as their next value (`overwrite_with_gradient`, "
            'as float8 training with `model.quantize("float8")` makes them): '
            "summed, they would differ from one device's. Train this model "
            "with `towers=1`. Received: towers="
            f"{model.num_towers}, workers={model.num_workers}"
        )


def couples_examples(loss: Any) -> bool:
    """Whether a Keras loss compares the examples of a batch with each other.

    `keras.losses.Circle` compares every pair of examples; `Dice` and
    `Tversky` with ``axis=None`` (their default) reduce over every element of
    the batch before they divide. Each gives one value for a batch that the
    values of its shards cannot be combined into.
    """
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if any(loss is f for f in _losses("circle", "dice", "tversky")):
        return True
    if isinstance(loss, _losses("Circle")):
        return True
    if isinstance(loss, _losses("Dice", "Tversky")):
        axis = loss.get_config().get("axis")
        return axis is None or 0 in tf.nest.flatten(axis)
    return False


def _losses(*names: str) -> tuple:
    """The losses of `keras.losses` so named (Keras 2 has none of these)."""
    return tuple(getattr(keras.losses, n) for n in names if hasattr(keras.losses, n))


def check_no_coupled_loss(model: keras.Model) -> None:
    """Raises if a compiled loss of `model` cannot be split over towers.

    Raises:
        ValueError: If one of the model's compiled losses `couples_examples`
            and the model does not compute its loss on the global batch.
    """
    if model.global_batch_loss or model.num_towers == 1:
        return
    coupled = [
        getattr(loss, "name", getattr(loss, "__name__", loss))
        for loss in tf.nest.flatten(getattr(model, "loss", None))
        if loss is not None and couples_examples(loss)
    ]
    if coupled:
        raise ValueError(
            f"The losses {coupled} compare the examples of a batch with each "
            "other: computed on each tower's shard, they would not add up to "
            "the loss of the whole batch. Create the model with "
            "`global_batch_loss=True` to compute the loss once, on the whole "
            "batch. Received: global_batch_loss=False"
        )


# The methods of `keras.Model` that decide what a step computes.
STEP_METHODS = (
    "call",
    "train_step",
    "test_step",
    "predict_step",
    "compute_loss",
    "compute_metrics",
)


def check_no_step_overrides(model: Any, target: type) -> None:
    """Refuses to wrap a model whose own class changes what a step computes.

    `TowerModel.from_model` reuses only the model's graph of layers: a
    `train_step`, `compute_loss` or `call` that the model's class defines
    would be dropped silently, and the model trained another way than on one
    device.

    Args:
        model: The `keras.Model` given to `TowerModel.from_model`.
        target: The class `from_model` builds; the methods its own bases
            define are kept.

    Raises:
        ValueError: If a class of `model`, other than Keras's and `target`'s
            bases, defines one of `STEP_METHODS`.
    """
    own = [
        f"{cls.__name__}.{name}"
        for cls in type(model).__mro__
        if not _keras_compat.is_keras_class(cls) and cls not in target.__mro__
        for name in STEP_METHODS
        if name in vars(cls)
    ]
    if own:
        raise ValueError(
            f"`{target.__name__}.from_model` reuses the layers of `model` but "
            f"not its class, which defines {', '.join(own)}: training would ignore "
            "them. Subclass TowerModel instead and build it from the same "
            "inputs and outputs (`class M(kerastower.TowerModel)`, then "
            f"`M(inputs, outputs, towers=...)`). Received: model={model.name!r} "
            f"({type(model).__name__})"
        )


def check_strategy(strategy: Any) -> None:
    """Checks `TowerModel`'s `strategy` argument.

    Raises:
        ValueError: If `strategy` is neither ``None`` nor a
            `tf.distribute.MultiWorkerMirroredStrategy`.
    """
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise ValueError(
            "`strategy` must be a tf.distribute.Strategy (such as "
            "MultiWorkerMirroredStrategy) or None. "
            f"Received: strategy={strategy!r}"
        )
    workers = (
        tf.distribute.MultiWorkerMirroredStrategy,
        tf.distribute.experimental.MultiWorkerMirroredStrategy,
    )
    if strategy is not None and not isinstance(strategy, workers):
        raise ValueError(
            "`strategy` is the strategy of the workers that train together, a "
            "tf.distribute.MultiWorkerMirroredStrategy; the devices of this "
            "machine are `towers` (for `MirroredStrategy(devices=[...])`, pass "
            f"`towers=[...]`). Received: strategy={type(strategy).__name__}"
        )


def check_not_distributed(args: tuple, kwargs: dict, names: tuple[str, ...]) -> None:
    """Refuses a `tf.distribute` dataset where `TowerModel` takes plain data.

    `names` are the data arguments to look at, the first also positional.

    Raises:
        ValueError: If one of them is a `tf.distribute.DistributedDataset`
            (from ``strategy.experimental_distribute_dataset`` or
            ``distribute_datasets_from_function``).
    """
    values = {name: kwargs.get(name) for name in names}
    if args:
        values[names[0]] = args[0]
    for name, value in values.items():
        if isinstance(value, tf.distribute.DistributedDataset):
            raise ValueError(
                f"`{name}` must be the tf.data.Dataset itself, not a "
                "tf.distribute dataset: TowerModel splits each batch over its "
                "towers (drop `strategy.experimental_distribute_dataset` and "
                f"`distribute_datasets_from_function`). Received: {name}="
                f"{type(value).__name__}"
            )


def graph_to_wrap(model: Any, cls: type) -> tuple[Any, Any]:
    """The inputs and outputs of `model`, for ``cls.from_model(model)``.

    Raises:
        ValueError: If `model` is not a built functional or `Sequential`
            `keras.Model`, or its class defines a method of `STEP_METHODS`
            that `cls` would drop (`check_no_step_overrides`).
    """
    if not isinstance(model, keras.Model):
        raise ValueError(
            f"`model` must be a keras.Model. Received: model={type(model).__name__}"
        )
    graph = _keras_compat.graph_of(model)
    try:
        inputs, outputs = graph.input, graph.output
    except (AttributeError, ValueError):
        inputs = outputs = None
    if inputs is None or outputs is None:
        raise ValueError(
            "`model` must be a built functional or Sequential model; "
            "subclassed models should subclass TowerModel instead. "
            f"Received: model={model.name!r} ({type(model).__name__})"
        )
    check_no_step_overrides(model, cls)
    return inputs, outputs
