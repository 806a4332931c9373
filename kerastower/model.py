"""`TowerModel`: a `keras.Model` whose steps split each batch over towers."""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import keras
import tensorflow as tf
from keras.src.models.functional import Functional
from keras.src.models.model import Trainer, functional_init_arguments
from keras.src.trainers.data_adapters import data_adapter_utils

from kerastower import _keras_compat, cluster, multi_worker
from kerastower import devices as devices_lib
from kerastower.batch_norm import global_moments
from kerastower.loss_weighting import TowerLoss, weigh_compiled_losses
from kerastower.sharding import (
    concat_nest,
    first_leaf,
    local_results,
    masks_of,
    split_nest,
    sum_gradients,
    with_masks,
)
from kerastower.splitting import tensor_split_sizes
from kerastower.strategy import TowerStrategy


def _warn_once(caught: list[warnings.WarningMessage]) -> None:
    """Re-raises recorded warnings, each distinct one once."""
    seen = set()
    for record in caught:
        text = re.sub(r"replica_\d+/", "", str(record.message))
        key = (record.category, text, record.filename, record.lineno)
        if key not in seen:
            seen.add(key)
            warnings.warn_explicit(
                record.message, record.category, record.filename, record.lineno
            )


class _IgnoredMetric:
    """Stands in for Keras's per-output loss metrics inside the towers.

    `TowerModel` updates the real metrics once, with the global values.
    """

    def update_state(self, value, sample_weight=None):
        del value, sample_weight


class _TowerLosses(NamedTuple):
    """What a tower needs to weight its loss (see `kerastower.loss_weighting`)."""

    records: dict
    loss_weights: list
    global_batch: tf.Tensor
    per_output_metrics: bool


@keras.saving.register_keras_serializable(package="kerastower")
class TowerModel(keras.Model):
    """A `keras.Model` that trains, evaluates and predicts over several towers.

    Each step cuts the **global** batch (the `batch_size` given to `fit`,
    `evaluate` and `predict`, all towers together) into contiguous shards, one
    per tower: with ``B`` examples and ``N`` towers the first ``B mod N`` towers
    get ``B // N + 1`` examples and the rest ``B // N``, so any ``B`` works,
    including ``B < N`` (some towers get none). Every tower runs the forward and
    backward pass on its device inside `tf.distribute.Strategy.run`; its loss is
    weighted by its share of the batch,

    ``loss = sum_i (n_i / B) * loss_i``,

    which equals the loss of the whole batch on one device for any loss that
    is a mean over examples (the Keras default reduction,
    ``"sum_over_batch_size"``). Regularization losses are counted once, since
    the weights sum to 1. The towers' gradients are summed and the model's own
    optimizer applies them once, so clipping, weight decay and optimizer
    state see exactly the single-device gradient. Metrics and the loss tracker
    are updated once on the whole batch; predictions come back in input order.

    The model's variables are ordinary variables: no `strategy.scope()` is
    needed and weights files are interchangeable with a plain `keras.Model`.

    `BatchNormalization` layers are synchronised across towers during training
    (two-pass mean and variance of the global batch, masks included; see
    `kerastower.batch_norm`), so they match one device. Pass
    ``sync_batch_norm=False`` to keep each layer's own ``synchronized``
    setting (per-tower statistics, as stock `MirroredStrategy`).

    Example:

    ```python
    import keras
    import kerastower

    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(1)(inputs)
    model = kerastower.TowerModel(inputs, outputs, towers=2)
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=10)   # 5 examples per tower
    ```

    A subclass that overrides `train_step` replaces the tower splitting with
    its own step (a warning says so); override `compute_loss` instead.

    Args:
        *args: Passed to `keras.Model` (e.g. ``inputs, outputs``).
        towers: ``None`` for all visible GPUs, or all logical CPUs when there is
            no GPU; an integer ``n`` for the first ``n`` of them; or a list of
            device names. Defaults to ``None``.
        sync_batch_norm: Whether `BatchNormalization` layers use statistics of
            the global batch while training. Defaults to ``True``.
        **kwargs: Passed to `keras.Model`.

    Raises:
        ValueError: If `towers` is not ``None``, an integer >= 1 or a list of
            existing device names, or asks for more devices than are visible.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if functional_init_arguments(args, kwargs) and not issubclass(cls, Functional):
            return super().__new__(_functional_class(cls, args))
        return super().__new__(cls)

    def __init__(
        self,
        *args: Any,
        towers: int | Sequence[str] | None = None,
        sync_batch_norm: bool = True,
        strategy: tf.distribute.Strategy | None = None,
        **kwargs: Any,
    ):
        self._tower_devices = devices_lib.resolve_towers(towers)
        self._towers_arg = list(towers) if isinstance(towers, (list, tuple)) else towers
        self.sync_batch_norm = bool(sync_batch_norm)
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise ValueError(
                "`strategy` must be a tf.distribute.MultiWorkerMirroredStrategy "
                f"or None. Received: strategy={strategy!r}"
            )
        if strategy is None and cluster.is_multi_worker():
            strategy = multi_worker.worker_strategy()
        self._worker_strategy = strategy
        if functional_init_arguments(args, kwargs) and not isinstance(self, Functional):
            # `super().__init__(inputs=..., outputs=...)` in a subclass's
            # `__init__`: become the functional variant of the subclass here,
            # where Keras would rewrite the bases of every class above it.
            self.__class__ = _functional_class(type(self), args)
        if isinstance(self, Functional):
            Trainer.__init__(self)
            Functional.__init__(self, *args, **kwargs)
        else:
            super().__init__(*args, **kwargs)
        self._tower_strategy = None
        self._gradient_accumulator = None
        if type(self).train_step is not TowerModel.train_step:
            warnings.warn(
                f"{type(self).__name__} overrides `train_step`, so its training "
                "steps are not split across towers. Override `compute_loss` "
                "instead to keep tower splitting.",
                stacklevel=2,
            )

    @property
    def num_towers(self) -> int:
        """The number of towers each batch is split across."""
        return len(self._tower_devices)

    @property
    def tower_devices(self) -> list[str]:
        """The device of each tower, in the order shards are assigned."""
        return list(self._tower_devices)

    @property
    def num_workers(self) -> int:
        """The number of workers (machines) training together; 1 by default."""
        if self._worker_strategy is None:
            return 1
        return multi_worker.num_workers_of(self._worker_strategy)

    @property
    def tower_strategy(self) -> TowerStrategy:
        """The `tf.distribute` strategy that runs the towers."""
        if self._tower_strategy is None:
            self._tower_strategy = TowerStrategy(self._tower_devices)
        return self._tower_strategy

    def _resolve_auto_jit_compile(self):
        if self.num_towers > 1:
            return False
        return super()._resolve_auto_jit_compile()

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if (
            self._distribute_strategy is not None
            or (self.num_towers == 1 and self.num_workers == 1)
            or type(self).train_step is not TowerModel.train_step
        ):
            # One device, or a step of the user's own (a GAN, a VAE), which may
            # have no `call` to build from: Keras defers the build to the trace.
            return super()._maybe_symbolic_build(iterator, data_batch)
        # Keras defers building loss and metric state to the first trace,
        # which for towers would happen inside the tower strategy. The build
        # calls the model once more than one device does: the warnings its
        # layers raise are raised again by the step's trace, so drop them here.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._symbolic_build(iterator=iterator, data_batch=data_batch)
        except StopIteration:
            pass  # no data: Keras warns that the input ran out, as on one device

    @contextlib.contextmanager
    def _tower_context(self, global_batch: tf.Tensor, sync_batch_norm: bool):
        """Weights compiled losses per tower and records per-output losses.

        While it is open, Keras's compiled losses are wrapped in
        `kerastower.loss_weighting.TowerLoss`, which records each tower's
        values for `_tower_loss`; Keras's per-output loss metrics ignore
        updates (`_update_loss_metrics` updates them once, with the global
        values); and, with `sync_batch_norm`, `BatchNormalization` layers use
        statistics of all towers.
        """
        patched = []
        if sync_batch_norm and self.sync_batch_norm:
            for layer in self._flatten_layers(include_self=False):
                if isinstance(layer, keras.layers.BatchNormalization):
                    _keras_compat.override_batch_norm_moments(layer, global_moments)
                    patched.append(layer)
        compile_loss = getattr(self, "_compile_loss", None)
        real_metrics = list(getattr(compile_loss, "_metrics", None) or [])
        if real_metrics:
            compile_loss._metrics = [_IgnoredMetric() for _ in real_metrics]
        real_losses = list(getattr(compile_loss, "_flat_losses", None) or [])
        records: dict = {}
        if real_losses:
            compile_loss._flat_losses = [
                entry._replace(loss=TowerLoss(entry.loss, records))
                for entry in real_losses
            ]
        loss_weights = [
            1.0 if entry.loss_weights is None else entry.loss_weights
            for entry in real_losses
        ]
        try:
            yield _TowerLosses(records, loss_weights, global_batch, bool(real_metrics))
        finally:
            for layer in patched:
                _keras_compat.restore_batch_norm(layer)
            if real_metrics:
                compile_loss._metrics = real_metrics
            if real_losses:
                compile_loss._flat_losses = real_losses

    def _global_batch_size(self, batch: tf.Tensor) -> tf.Tensor:
        """The batch size summed over workers, as float32."""
        return self._sum_over_workers(tf.cast(batch, tf.float32))

    def _sum_over_workers(self, values):
        if self.num_workers == 1:
            return values
        return multi_worker.all_reduce_sum(self._worker_strategy, values)

    def _metric_results_over_workers(self, update_metrics):
        """Runs `update_metrics` and makes every metric count all workers.

        Keras metrics keep additive state (totals and counts), so summing each
        worker's change of state gives the state of one metric fed every
        worker's examples.
        """
        if self.num_workers == 1:
            return update_metrics()
        variables = [v for m in self.metrics for v in m.variables]
        before = [tf.identity(v) for v in variables]
        with tf.control_dependencies(before):
            update_metrics()
        deltas = [v - b for v, b in zip(variables, before)]
        for variable, old, delta in zip(
            variables, before, self._sum_over_workers(deltas)
        ):
            variable.assign(old + delta)
        return self.get_metrics_result()

    def _split_run(self, tower_fn, combine, data, across_workers: bool = True):
        """Runs `tower_fn(shard, weight, losses)` per tower and combines.

        `combine` turns the list of per-tower outputs into the step's result.
        Returns that result and the global batch size ``B``, as float32.

        Each tower's weight is its share ``n_i / B`` of the global batch: of all
        workers' batches when `across_workers`, else of this worker's (for
        `predict`, which needs no weight and must not wait for the other
        workers). A batch smaller than the number of towers would leave towers
        without an example, which some TensorFlow kernels mishandle (oneDNN
        convolutions return a wrongly shaped empty tensor), so it runs whole on
        the first tower instead, exactly as on one device.
        """
        batch = tf.shape(first_leaf(data))[0]
        total = (
            self._global_batch_size(batch)
            if across_workers
            else tf.cast(batch, tf.float32)
        )

        def on_towers():
            return combine(self._run_towers(tower_fn, data, batch, total))

        def on_one_tower():
            weight = tf.cast(batch, tf.float32) / total
            with self._tower_context(total, sync_batch_norm=False) as losses:
                with tf.device(self._tower_devices[0]):
                    return combine([tower_fn(data, weight, losses)])

        # Each tower, and the one-tower branch, traces the model: a warning
        # raised by a layer would print once per tower. Show each once.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tf.cond(batch >= self.num_towers, on_towers, on_one_tower)
        _warn_once(caught)
        return result, total

    def _run_towers(self, tower_fn, data, batch, total):
        """Splits `data` into shards and runs `tower_fn` on every tower."""
        # Hide the sizes from shape inference, so that a tower's static batch
        # size is unknown whatever the global batch (see `sum_gradients`).
        sizes = tf.compat.v1.placeholder_with_default(
            tensor_split_sizes(batch, self.num_towers), [self.num_towers]
        )
        weights = tf.cast(sizes, tf.float32) / total
        shards = split_nest(data, sizes, self.num_towers)
        strategy = self.tower_strategy
        inputs = strategy.experimental_distribute_values_from_function(
            lambda ctx: (
                shards[ctx.replica_id_in_sync_group],
                weights[ctx.replica_id_in_sync_group],
            )
        )
        with self._tower_context(total, sync_batch_norm=True) as losses:
            outputs = strategy.run(
                lambda args: tower_fn(args[0], args[1], losses), args=(inputs,)
            )
        return local_results(strategy, outputs)

    def _tower_loss(self, x, y, y_pred, sample_weight, weight, losses, training):
        """This tower's weighted share of the step's loss and of each output's.

        See `kerastower.loss_weighting` for the rule.
        """
        loss = self._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        records = losses.records.pop(tf.distribute.get_replica_context(), [])
        factors = weigh_compiled_losses(records, losses.global_batch)
        per_output = []
        for (value, _, _), factor, loss_weight in zip(
            records, factors, losses.loss_weights
        ):
            value = tf.cast(value, loss.dtype)
            factor = tf.cast(factor, loss.dtype)
            # Keras added value * loss_weight; make it value * loss_weight *
            # factor. A non-finite value already makes the loss non-finite,
            # as on one device; correcting it would turn inf into NaN.
            correction = (factor - 1.0) * tf.cast(loss_weight, loss.dtype) * value
            finite = tf.math.is_finite(value)
            loss = loss + tf.where(finite, correction, tf.zeros_like(correction))
            per_output.append(value * factor)
        weight = tf.cast(weight, loss.dtype)
        if not losses.per_output_metrics:
            per_output = []
        return loss * weight, [v * weight for v in per_output]

    @staticmethod
    def _combine_losses(per_tower):
        """Adds up the towers' weighted losses and per-output losses."""
        loss = tf.add_n([t[1] for t in per_tower])
        per_output = [tf.add_n(list(v)) for v in zip(*[t[3] for t in per_tower])]
        y_pred = concat_nest([with_masks(t[2], t[4]) for t in per_tower])
        return loss, y_pred, per_output, masks_of(y_pred)

    def _update_loss_metrics(self, per_output, y_pred):
        """Updates Keras's per-output loss metrics once, with global values."""
        batch_dim = first_leaf(y_pred).shape[0]
        compile_loss = getattr(self, "_compile_loss", None)
        metrics = getattr(compile_loss, "_metrics", None) or []
        for metric, value in zip(metrics, self._sum_over_workers(per_output)):
            metric.update_state(value, sample_weight=batch_dim)

    def _check_optimizer(self):
        if getattr(self.optimizer, "gradient_accumulation_steps", None):
            raise ValueError(
                "TowerModel does not support the optimizer's own "
                "`gradient_accumulation_steps`: it weights every micro-batch "
                "1/k whatever its size. Use the exact "
                "`kerastower.callbacks.GradientAccumulation(steps)` callback "
                "instead. Received: gradient_accumulation_steps="
                f"{self.optimizer.gradient_accumulation_steps}"
            )

    def _forward(self, x, training: bool):
        if self._call_has_training_arg:
            return self(x, training=training)
        return self(x)

    def _one_device_gradients(self, x, y, sample_weight, trainable):
        with tf.GradientTape() as tape:
            y_pred = self._forward(x, training=True)
            loss = self._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            scaled = self.optimizer.scale_loss(loss)
        return tape.gradient(scaled, trainable), loss, y_pred

    def _tower_gradients(self, x, y, sample_weight, trainable):
        connected: list[int] = []

        def tower_fn(shard, weight, losses):
            tx, ty, tsw = shard
            with tf.GradientTape() as tape:
                y_pred = self._forward(tx, training=True)
                loss, per_output = self._tower_loss(
                    tx, ty, y_pred, tsw, weight, losses, training=True
                )
                scaled = self.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, trainable)
            connected[:] = [j for j, g in enumerate(grads) if g is not None]
            return (
                [grads[j] for j in connected],
                loss,
                y_pred,
                per_output,
                masks_of(y_pred),
            )

        def combine(per_tower):
            loss, y_pred, per_output, masks = self._combine_losses(per_tower)
            grads = [
                sum_gradients([t[0][k] for t in per_tower])
                for k in range(len(connected))
            ]
            return grads, loss, y_pred, per_output, masks

        (grads, loss, y_pred, per_output, masks), total = self._split_run(
            tower_fn, combine, (x, y, sample_weight)
        )
        y_pred = with_masks(y_pred, masks)
        self._update_loss_metrics(per_output, y_pred)
        gradients = [None] * len(trainable)
        for k, j in enumerate(connected):
            gradients[j] = grads[k]
        return gradients, loss, y_pred, total

    def train_step(self, data):
        self._check_optimizer()
        accumulator = getattr(self, "_gradient_accumulator", None)
        if self.num_towers == 1 and accumulator is None and self.num_workers == 1:
            with tf.device(self._tower_devices[0]):
                return super().train_step(data)
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        trainable = self.trainable_weights
        batch_size = tf.shape(first_leaf(x))[0]
        if self.num_towers == 1 and self.num_workers == 1:
            with tf.device(self._tower_devices[0]):
                gradients, loss, y_pred = self._one_device_gradients(
                    x, y, sample_weight, trainable
                )
            global_batch_size = batch_size
        else:
            gradients, loss, y_pred, global_batch_size = self._tower_gradients(
                x, y, sample_weight, trainable
            )
        if self.num_workers > 1:
            connected = [j for j, g in enumerate(gradients) if g is not None]
            summed = self._sum_over_workers(
                [loss] + [tf.convert_to_tensor(gradients[j]) for j in connected]
            )
            loss = summed[0]
            for j, grad in zip(connected, summed[1:]):
                gradients[j] = grad
        if not trainable:
            warnings.warn(
                "The model does not have any trainable weights.", stacklevel=2
            )
        elif accumulator is not None:
            # Micro-batches weigh by their examples on all workers together.
            accumulator.accumulate(gradients, global_batch_size, self.optimizer)
        else:
            self.optimizer.apply_gradients(zip(gradients, trainable))

        def update_metrics():
            self._loss_tracker.update_state(loss, sample_weight=batch_size)
            return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

        return self._metric_results_over_workers(update_metrics)

    def test_step(self, data):
        if self.num_towers == 1 and self.num_workers == 1:
            with tf.device(self._tower_devices[0]):
                return super().test_step(data)
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)

        def tower_fn(shard, weight, losses):
            tx, ty, tsw = shard
            y_pred = self._forward(tx, training=False)
            loss, per_output = self._tower_loss(
                tx, ty, y_pred, tsw, weight, losses, training=False
            )
            return (), loss, y_pred, per_output, masks_of(y_pred)

        (loss, y_pred, per_output, masks), _ = self._split_run(
            tower_fn, self._combine_losses, (x, y, sample_weight)
        )
        y_pred = with_masks(y_pred, masks)
        loss = self._sum_over_workers(loss)
        self._update_loss_metrics(per_output, y_pred)

        def update_metrics():
            self._loss_tracker.update_state(
                loss, sample_weight=tf.shape(first_leaf(x))[0]
            )
            return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

        return self._metric_results_over_workers(update_metrics)

    def predict_step(self, data):
        if self.num_towers == 1:
            with tf.device(self._tower_devices[0]):
                return super().predict_step(data)
        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(data)

        def tower_fn(shard, weight, losses):
            return self._forward(shard, training=False)

        y_pred, _ = self._split_run(tower_fn, concat_nest, x, across_workers=False)
        return y_pred

    def fit(self, *args, **kwargs):
        if self.num_workers > 1:
            # Last, so that it runs after BackupAndRestore or a resuming
            # checkpoint callback has loaded the chief's state.
            callbacks = list(kwargs.pop("callbacks", None) or [])
            kwargs["callbacks"] = callbacks + [multi_worker.BroadcastFromChief()]
        return super().fit(*args, **kwargs)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["towers"] = self._towers_arg
        config["sync_batch_norm"] = self.sync_batch_norm
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        towers = config.get("towers")
        try:
            devices_lib.resolve_towers(towers)
        except ValueError as error:
            warnings.warn(
                f"The saved model asked for towers={towers!r}, which this "
                f"machine cannot provide ({error}); using every available "
                "device instead.",
                stacklevel=2,
            )
            config["towers"] = None
        return super().from_config(config, custom_objects=custom_objects)

    @classmethod
    def from_model(
        cls,
        model: keras.Model,
        towers: int | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> TowerModel:
        """Wraps a functional or `Sequential` model's graph as a `TowerModel`.

        The new model shares the layers, and so the weights, of `model`: no
        layer is rebuilt. Compile the returned model before training it.

        Example:

        ```python
        plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model = kerastower.TowerModel.from_model(plain, towers=2)
        ```

        Args:
            model: A built functional `keras.Model` or `keras.Sequential`.
            towers: As in `TowerModel`. Defaults to ``None``.
            **kwargs: Other `TowerModel` arguments (``sync_batch_norm``,
                ``name``). The name defaults to ``model.name``.

        Returns:
            A `TowerModel` over the same layers.

        Raises:
            ValueError: If `model` is a subclassed model (it has no graph of
                inputs and outputs to reuse) or is not built.
        """
        if not isinstance(model, keras.Model):
            raise ValueError(
                f"`model` must be a keras.Model. Received: model={type(model).__name__}"
            )
        graph = getattr(model, "_functional", None) or model  # Sequential
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
        kwargs.setdefault("name", model.name)
        return cls(inputs, outputs, towers=towers, **kwargs)


@keras.saving.register_keras_serializable(package="kerastower")
class FunctionalTowerModel(TowerModel, Functional):
    """The class of ``TowerModel(inputs, outputs)``: a functional `TowerModel`."""


_FUNCTIONAL_CLASSES: dict[type, type] = {TowerModel: FunctionalTowerModel}


def _functional_class(cls: type, args) -> type:
    """The functional variant of a `TowerModel` subclass built from a graph.

    ``M(inputs, outputs)`` for ``class M(TowerModel)`` (the keras.io pattern
    for overriding `compute_loss` or `train_step`) is an instance of a class
    deriving from both ``M`` and `FunctionalTowerModel`, made once per ``M``;
    no class's bases are ever changed. It saves and loads under ``M``'s name.
    """
    if cls not in _FUNCTIONAL_CLASSES:
        defines_call = any(
            "call" in vars(base)
            for base in cls.__mro__[: cls.__mro__.index(TowerModel)]
        )
        if defines_call:
            raise ValueError(
                f"{cls.__name__} subclasses TowerModel and defines `call`; "
                "it cannot also be built from `inputs` and `outputs`. Build it "
                f"without them, or drop `call`. Received: args={args!r}"
            )
        variant = type(
            cls.__name__,
            (cls, FunctionalTowerModel),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
        _keras_compat.register_alias(variant, cls)
        _FUNCTIONAL_CLASSES[cls] = variant
    return _FUNCTIONAL_CLASSES[cls]
