"""`TowerModel`: a `keras.Model` whose steps split each batch over towers."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower import devices as devices_lib
from kerastower._keras_compat import Functional, functional_init_arguments
from kerastower._keras_compat.family import keras
from kerastower.entry_points import EntryPoints
from kerastower.reduce import keys, replica_setting, workers
from kerastower.reduce.accumulation import GradientWindow
from kerastower.reduce.replicas import Replicas
from kerastower.reduce.ring import AllReduceOptions
from kerastower.step import checks, custom_step, traced_towers
from kerastower.step.plan import ONE_DEVICE
from kerastower.step.tower_step import TowerStep
from kerastower.strategy import TowerStrategy
from kerastower.workers import cluster, multi_worker


@_keras_compat.register_serializable("kerastower")
class TowerModel(EntryPoints, _keras_compat.TrainerHooks, keras.Model):
    """A `keras.Model` that trains, evaluates and predicts over several towers.

    Each step cuts the **global** batch (the `batch_size` given to `fit`,
    `evaluate` and `predict`, all towers together) into contiguous shards, one
    per tower: with ``B`` examples and ``N`` towers the first ``B mod N`` towers
    get ``B // N + 1`` examples and the rest ``B // N``, so any ``B`` works (a
    batch smaller than ``N`` runs whole on the first tower). Every tower runs
    the forward and backward pass on its device inside
    `tf.distribute.Strategy.run`; its loss is weighted so that the towers add
    up to the loss of the whole batch on one device,

    ``loss = sum_i (D_i / D) * loss_i``,

    where ``D_i`` is what Keras divides tower ``i``'s loss by: its examples
    for the default reduction, its valid elements for a masked or
    ``ignore_class`` loss, its sample weights for ``"mean_with_sample_weight"``
    (checked against Keras's own reduction the first time it is used).
    Regularization losses are counted once. The towers' gradients are
    summed (sparse ones stay sparse) and the model's own optimizer applies
    them once, so clipping, weight decay and optimizer state see exactly the
    single-device gradient. Metrics and the loss tracker are updated once on
    the whole batch; predictions come back in input order.

    Its variables are ordinary variables: no `strategy.scope()`, and weights
    files are interchangeable with a plain `keras.Model`'s.

    `BatchNormalization` layers are synchronised across towers during training
    (two-pass mean and variance of the global batch, masks included), so
    they match one device. Pass ``sync_batch_norm=False`` to keep each
    layer's own ``synchronized`` setting (per-tower statistics, as stock
    `MirroredStrategy`).

    Example:

    ```python
    import keras
    import numpy as np

    import kerastower

    kerastower.configure_logical_devices(2)  # without GPUs: 2 logical CPUs

    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(1)(inputs)
    model = kerastower.TowerModel(inputs, outputs, towers=2)
    model.compile(optimizer="adam", loss="mse")

    x = np.random.default_rng(0).normal(size=(100, 8)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model.fit(x, y, batch_size=10, epochs=2)  # 5 examples per tower
    ```

    A subclass's own `train_step` runs on one device unless it takes its
    gradients with `tower_gradients` (a warning says so); or override
    `compute_loss`. A subclass without `call` builds from a graph, as
    ``MyModel(inputs, outputs)``.

    Args:
        *args: Passed to `keras.Model` (e.g. ``inputs, outputs``).
        towers: ``None`` for all visible GPUs, or all logical CPUs when there is
            no GPU; an integer ``n`` for the first ``n`` of them; or a list of
            device names. Defaults to ``None``.
        sync_batch_norm: Whether `BatchNormalization` layers use statistics of
            the global batch while training. Defaults to ``True``.
        strategy: The `tf.distribute.Strategy` of the workers that train this
            model together, normally the
            `tf.distribute.MultiWorkerMirroredStrategy` of
            `kerastower.worker_strategy`; its workers' batches, gradients and
            metrics are summed, while `towers` sets the devices of this
            worker. ``None`` takes `kerastower.worker_strategy()` when
            `TF_CONFIG` names two or more workers, and trains on this worker
            alone otherwise. Defaults to ``None``.
        replicate_variables: Whether each tower trains on its own replica of
            the trainable variables, updated with the same ring all-reduced
            gradient by a clone of the optimizer: no device moves much more
            than ``2 (N-1)/N`` times the gradient bytes per step, instead
            of about ``N`` times that on the first tower. ``"auto"``
            replicates when every tower is a GPU, on one worker, and for a
            `train_step` of your own on 5 GPUs or more (on logical CPUs,
            ``$KERASTOWER_REPLICATE_VARIABLES=1`` forces it). ``True``
            replicates, on several workers in one ring over every worker's
            towers. Defaults to ``"auto"``.
        all_reduce: How replicas all-reduce their gradients: a
            `kerastower.AllReduceOptions` (buckets of 25 MB, exact, by
            default) or the dict of one. Defaults to ``None``.
        global_batch_loss: Whether the loss is computed on the whole global
            batch from every tower's gathered predictions, instead of on
            each shard: for losses that compare the examples of a batch
            (contrastive losses, `keras.losses.Circle`, `Dice` and `Tversky`
            with ``axis=None``, which raise an error without it); on several
            workers, of all workers' batches. Defaults to ``False``.
        **kwargs: Passed to `keras.Model`.

    Raises:
        ValueError: If `towers` is not ``None``, an integer of at least 1 or a
            list of existing device names, or asks for more devices than are
            visible; if `strategy` is not ``None`` or a
            `tf.distribute.Strategy`; if `replicate_variables` is not
            ``True``, ``False`` or ``"auto"``, or ``True`` with several
            workers.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        # An `__init__` of its own (``VAE(encoder, decoder)``) has its own args.
        own_init = cls.__init__ is not TowerModel.__init__
        functional = functional_init_arguments(args, kwargs) and not own_init
        if functional and not issubclass(cls, Functional):
            return super().__new__(_functional_class(cls, args))
        return super().__new__(cls)

    def __init__(
        self,
        *args: Any,
        towers: int | Sequence[str] | None = None,
        sync_batch_norm: bool = True,
        strategy: tf.distribute.Strategy | None = None,
        replicate_variables: bool | str = "auto",
        global_batch_loss: bool = False,
        all_reduce: AllReduceOptions | dict | None = None,
        **kwargs: Any,
    ):
        checks.check_no_strategy_scope()
        self._tower_devices = devices_lib.resolve_towers(towers)
        self._towers_arg = list(towers) if isinstance(towers, (list, tuple)) else towers
        self.sync_batch_norm = bool(sync_batch_norm)
        checks.check_strategy(strategy)
        if strategy is None and cluster.is_multi_worker():
            strategy = multi_worker.worker_strategy()
        self._worker_strategy = strategy
        self.replicate_variables = replica_setting.check_setting(replicate_variables)
        self.global_batch_loss = bool(global_batch_loss)
        if isinstance(all_reduce, dict):
            all_reduce = AllReduceOptions(**all_reduce)
        self.all_reduce = all_reduce or AllReduceOptions()
        if functional_init_arguments(args, kwargs) and not isinstance(self, Functional):
            # `super().__init__(inputs=..., outputs=...)` in a subclass's
            # `__init__`: become the functional variant of the subclass here,
            # where Keras would rewrite the bases of every class above it.
            self.__class__ = _functional_class(type(self), args)
        if isinstance(self, Functional):
            _keras_compat.init_functional(self, args, kwargs)
        else:
            super().__init__(*args, **kwargs)
        self._tower_strategy = None
        replicas = None
        if replica_setting.replicates(
            self.replicate_variables,
            self._tower_devices,
            self.num_workers,
            own_step=type(self).train_step is not TowerModel.train_step,
        ):
            span = None
            if self.num_workers > 1:
                span = functools.partial(workers.replica_span, self)
            replicas = Replicas(self._tower_devices, self.all_reduce, span)
        self._tower_step = TowerStep(self, replicas)
        custom_step.warn_if_not_split(type(self), TowerModel.train_step)

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
        return _keras_compat.strategy_num_workers(self._worker_strategy)

    @property
    def worker_strategy(self) -> tf.distribute.Strategy | None:
        """The strategy of the workers training together, or ``None`` for one.

        The `strategy` argument, or `kerastower.worker_strategy()` when
        `TF_CONFIG` names several workers; its collectives sum the workers'
        batches, gradients and metrics.
        """
        return self._worker_strategy

    @property
    def gradient_accumulator(self) -> GradientWindow | None:
        """The window of gradients training steps add to, instead of applying.

        ``None`` (the default) applies every step's gradients.
        `kerastower.callbacks.GradientAccumulation` sets it for the length of
        a `fit`; setting it makes the training function anew, so the next
        step traces with it.
        """
        return self._tower_step.accumulator

    @gradient_accumulator.setter
    def gradient_accumulator(self, accumulator: GradientWindow | None) -> None:
        self._tower_step.accumulator = accumulator
        self.make_train_function(force=True)

    @property
    def tower_strategy(self) -> TowerStrategy:
        """The `tf.distribute` strategy that runs the towers."""
        if self._tower_strategy is None:
            self._tower_strategy = TowerStrategy(self._tower_devices)
        return self._tower_strategy

    def _builds_before_towers(self) -> bool:
        """Whether Keras builds losses and metrics before the first step."""
        return self.num_towers > 1 or self.num_workers > 1

    @property
    def _tower_train_step(self):
        return TowerModel.train_step

    def _prepare_step_variables(self) -> None:
        """Makes, before a step traces, the variables its trace would make:
        the counter of the instance keys new at every run, which the
        replicas' ring takes for sparse rows and on several workers
        (`kerastower.reduce.keys.run_key`)."""
        if self.num_towers > 1 or self.num_workers > 1:
            keys.prepare_run_keys()

    def _step_function_made(self, step: str) -> None:
        """Keras made a new function for `step` ("train_step", ...): its
        trace takes new keys over the workers (`keys.step_keys`), as the
        sums it traces may have new shapes (a recompiled model's metrics)."""
        keys.forget_step_keys(self, step)

    def _step_optimised_once(self, step: str) -> bool:
        """Whether Keras's function for `step` ("train_step", ...) gets one
        round of Grappler: the step is ours and traces its towers once."""
        own = getattr(type(self), step) is getattr(TowerModel, step)
        workers = 1 if step == "predict_step" else self.num_workers
        return own and traced_towers.applies(self, workers)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "train_step" in cls.__dict__:
            cls.train_step = custom_step.over_workers(cls.__dict__["train_step"])

    def train_step(self, data):
        checks.check_optimizer(self.optimizer)
        plan = self._tower_step.plan()
        if plan.keras_step:
            with tf.device(self._tower_devices[0]):
                return super().train_step(data)
        with keys.step_keys(self, "train_step"):
            return self._tower_step.train(data, plan)

    def tower_gradients(
        self,
        loss_fn: Callable[..., Any],
        variables: Sequence[keras.Variable],
        *tensors: Any,
        has_aux: bool = False,
    ) -> tuple:
        """Gradients of a batch's mean loss, computed on the towers.

        For a custom `train_step` (a GAN, a VAE): cuts each of `tensors`, the
        **global** batch of ``B`` examples on axis 0, into the towers' shards
        as the built-in step does (``n_i`` examples for tower ``i``, maybe
        0), runs ``loss_fn(*shards)`` on every tower under a
        `tf.GradientTape`, and returns what one device computes on the batch:

        ``L = sum_i (n_i / B) * L_i``  and  ``g = sum_i (n_i / B) * dL_i/dw``,

        where ``L_i``, what `loss_fn` returns, is the **mean** loss over the
        ``n_i`` examples it is given (Keras's ``"sum_over_batch_size"``).
        Gradients are summed as in the built-in step (sparse ones stay exact
        for Adam); a compiled loss added through ``self.compute_loss`` is
        weighted as there. With one tower this is ``tape.gradient`` of
        ``loss_fn(*tensors)``; it works traced and with ``run_eagerly=True``.
        Draw random numbers on the whole batch **before** the call and pass
        them in: in `loss_fn` each tower would draw its own.

        Example:

        ```python
        import keras

        import kerastower


        class Regressor(kerastower.TowerModel):
            def train_step(self, data):
                x, y = data  # the global batch

                def loss_fn(x, y):  # one tower's shard: the mean over it
                    return keras.ops.mean(keras.ops.square(y - self(x)))

                variables = self.trainable_weights
                grads, loss = self.tower_gradients(loss_fn, variables, x, y)
                self.optimizer.apply_gradients(zip(grads, variables))
                return {"loss": loss}
        ```

        Args:
            loss_fn: A callable taking a shard of each of `tensors` and
                returning the mean loss over its examples, a scalar; with
                `has_aux`, a pair ``(loss, outputs)``.
            variables: The list of variables to differentiate, such as
                ``self.generator.trainable_weights``.
            *tensors: Tensors (or nests) with the global batch on axis 0.
            has_aux: Whether `loss_fn` also returns outputs with the examples
                on axis 0 (predictions, say), concatenated over the towers in
                input order. Defaults to ``False``.

        Returns:
            ``(gradients, loss)``, or ``(gradients, loss, outputs)`` with
            `has_aux`; a gradient (``None`` if unconnected) per variable, and
            the mean loss over the global batch.

        Raises:
            ValueError: If an argument is not as described, or the tensors'
                batch sizes differ (`InvalidArgumentError` when the traced
                step runs, where they are not known before).
            RuntimeError: If called inside a `tf.distribute` strategy's scope
                or replica function, such as inside `loss_fn`.
        """
        return custom_step.own_step_gradients(
            self._tower_step, loss_fn, variables, tensors, has_aux=has_aux
        )

    def test_step(self, data):
        plan = self._tower_step.plan()
        if plan.towers == ONE_DEVICE:
            with tf.device(self._tower_devices[0]):
                return super().test_step(data)
        with keys.step_keys(self, "test_step"):
            return self._tower_step.test(data, plan)

    def predict_step(self, data):
        plan = self._tower_step.plan(across_workers=False)
        if plan.towers == ONE_DEVICE:
            with tf.device(self._tower_devices[0]):
                return super().predict_step(data)
        return self._tower_step.predict(data, plan)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["towers"] = self._towers_arg
        config["sync_batch_norm"] = self.sync_batch_norm
        config["replicate_variables"] = self.replicate_variables
        config["global_batch_loss"] = self.global_batch_loss
        config["all_reduce"] = dataclasses.asdict(self.all_reduce)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["towers"] = devices_lib.saved_towers(config.get("towers"))
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
        import keras

        import kerastower

        plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model = kerastower.TowerModel.from_model(plain)  # shares plain's weights
        model.compile(optimizer="adam", loss="mse")
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
                inputs and outputs to reuse), is not built, or its class
                defines a `call`, `train_step`, `test_step`, `predict_step`,
                `compute_loss` or `compute_metrics` (which the new model would
                not have).
        """
        inputs, outputs = checks.graph_to_wrap(model, cls)
        kwargs.setdefault("name", model.name)
        return cls(inputs, outputs, towers=towers, **kwargs)


@_keras_compat.register_serializable("kerastower")
class FunctionalTowerModel(TowerModel, Functional):
    """The class of ``TowerModel(inputs, outputs)``: a functional `TowerModel`."""


def _functional_class(cls: type, args) -> type:
    """The functional variant of `cls`, built from ``inputs, outputs`` `args`."""
    return _keras_compat.functional_variant(cls, FunctionalTowerModel, TowerModel, args)
