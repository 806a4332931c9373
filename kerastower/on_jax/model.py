"""`TowerModel` on Keras 3's JAX backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import keras

from kerastower import _functional_variants, tower_choice
from kerastower._keras_compat import jax as jax_fence
from kerastower.on_jax import steps
from kerastower.on_jax.placement import Placement, device_name, resolve_devices


@keras.saving.register_keras_serializable("kerastower")
class TowerModel(keras.Model):
    """A `keras.Model` that trains, evaluates and predicts over several devices.

    On JAX each step is one program over the towers' devices (GSPMD): every
    device holds the variables; a **global** batch of ``B`` examples (the
    `batch_size` given to `fit`, `evaluate` and `predict`) that divides by the
    number of towers ``N`` is cut into ``N`` contiguous shards of ``B / N``
    rows, one per device, and XLA adds the collectives that the whole batch
    needs, so that every loss, metric and `BatchNormalization` moment is the
    one of the whole batch, as on one device (up to the order of float
    additions). A batch that does not divide by ``N`` (an epoch's last batch,
    or a batch of 1) runs whole on every device: exactly one device's step, at
    one device's speed. So any ``B`` works, and ``fit`` compiles at most two
    programs, as plain Keras does for an epoch with a last, smaller batch.
    Predictions come back in input order.

    Its variables are ordinary Keras variables: weights files are
    interchangeable with a plain `keras.Model`'s.

    Example:

    ```python
    # XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax
    import keras
    import numpy as np

    import kerastower

    inputs = keras.Input((8,))
    outputs = keras.layers.Dense(1)(inputs)
    model = kerastower.TowerModel(inputs, outputs, towers=2)
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(100, 8)).astype("float32")
    model.fit(x, x.sum(axis=1, keepdims=True), batch_size=10)  # 5 per device
    ```

    A subclass's own ``train_step(state, data)`` (Keras's JAX form) or
    ``compute_loss`` runs over the towers as it is.

    Args:
        *args: Passed to `keras.Model` (e.g. ``inputs, outputs``).
        towers: ``None`` for every device of JAX's default backend (its GPUs,
            or its CPUs, which
            ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` sets); an
            integer ``n`` for the first ``n``; or a list of device names
            (``"gpu:0"``, or TensorFlow's ``"/gpu:0"``). Defaults to ``None``.
        sync_batch_norm: Must be ``True``: on JAX, `BatchNormalization` always
            uses the statistics of the global batch.
        strategy: Must be ``None``: one process only on JAX.
        replicate_variables: ``"auto"`` or ``True``: on JAX every device
            holds the variables.
        global_batch_loss: Accepted for portability; on JAX every loss is
            computed on the global batch.
        all_reduce: Must be ``None``: XLA chooses the collectives on JAX.
        **kwargs: Passed to `keras.Model`.

    Raises:
        ValueError: If `towers` is not ``None``, an integer of at least 1 or a
            list of existing device names, or asks for more devices than are
            visible; or an argument asks for what only the TensorFlow backend
            has.
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        own_init = cls.__init__ is not TowerModel.__init__
        functional = jax_fence.functional_init_arguments(args, kwargs)
        if functional and not own_init and not issubclass(cls, jax_fence.Functional):
            return super().__new__(_functional_class(cls, args))
        return super().__new__(cls)

    def __init__(
        self,
        *args: Any,
        towers: int | Sequence[str] | None = None,
        sync_batch_norm: bool = True,
        strategy: Any = None,
        replicate_variables: bool | str = "auto",
        global_batch_loss: bool = False,
        all_reduce: Any = None,
        **kwargs: Any,
    ):
        _check_tensorflow_only(
            sync_batch_norm, strategy, replicate_variables, all_reduce
        )
        if jax.process_count() > 1:
            raise ValueError(
                "`TowerModel` on JAX trains in one process; several JAX "
                "processes are not supported yet. Received: "
                f"jax.process_count()={jax.process_count()}"
            )
        self._placement = Placement(resolve_devices(towers))
        self._towers_arg = list(towers) if isinstance(towers, (list, tuple)) else towers
        self.sync_batch_norm = True
        self.replicate_variables = replicate_variables
        self.global_batch_loss = bool(global_batch_loss)
        functional = jax_fence.functional_init_arguments(args, kwargs)
        if functional and not isinstance(self, jax_fence.Functional):
            self.__class__ = _functional_class(type(self), args)
        if isinstance(self, jax_fence.Functional):
            jax_fence.init_functional(self, args, kwargs)
        else:
            super().__init__(*args, **kwargs)

    @property
    def num_towers(self) -> int:
        """The number of towers each batch is split across."""
        return len(self._placement.devices)

    @property
    def tower_devices(self) -> list[str]:
        """The device of each tower (``"gpu:0"``), in the order of the shards."""
        return [device_name(d) for d in self._placement.devices]

    @property
    def num_workers(self) -> int:
        """The number of workers (processes) training together: 1 on JAX."""
        return 1

    @property
    def worker_strategy(self) -> None:
        """``None``: no `tf.distribute` strategy on JAX."""
        return None

    def make_train_function(self, force: bool = False):
        if self.train_function is None or force:
            run = steps.compile_step(self, self.train_step, self._placement)
            self.train_function = steps.iterate(run, self.steps_per_execution)
        return self.train_function

    def make_test_function(self, force: bool = False):
        if self.test_function is None or force:
            run = steps.compile_step(self, self.test_step, self._placement)
            self.test_function = steps.iterate(run, self.steps_per_execution)
        return self.test_function

    def make_predict_function(self, force: bool = False):
        if self.predict_function is None or force:
            step = steps.predict_with_state(self)
            run = steps.compile_step(self, step, self._placement)
            self.predict_function = steps.iterate(
                run, self.steps_per_execution, concatenate=True
            )
        return self.predict_function

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["towers"] = self._towers_arg
        config["global_batch_loss"] = self.global_batch_loss
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["towers"] = tower_choice.saved_towers(
            config.get("towers"), resolve_devices
        )
        for tensorflow_only in ("sync_batch_norm", "replicate_variables", "all_reduce"):
            config.pop(tensorflow_only, None)  # saved on TensorFlow
        return super().from_config(config, custom_objects=custom_objects)

    @classmethod
    def from_model(
        cls,
        model: keras.Model,
        towers: int | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> TowerModel:
        """Wraps a functional or `Sequential` model's graph as a `TowerModel`
        sharing its layers, and so its weights. Compile it before training.

        Raises:
            ValueError: If `model` has no graph of inputs and outputs (a
                subclassed or unbuilt model).
        """
        if not isinstance(model, jax_fence.Functional):
            raise ValueError(
                "`from_model` takes a built functional or `Sequential` model. "
                f"Received: model={model!r} ({type(model).__name__})"
            )
        kwargs.setdefault("name", model.name)
        return cls(model.inputs, model.outputs, towers=towers, **kwargs)


@keras.saving.register_keras_serializable("kerastower")
class FunctionalTowerModel(TowerModel, jax_fence.Functional):
    """The class of ``TowerModel(inputs, outputs)``: a functional `TowerModel`."""


def _functional_class(cls: type, args) -> type:
    return _functional_variants.functional_variant(
        cls, FunctionalTowerModel, TowerModel, args, jax_fence.register_alias
    )


def _check_tensorflow_only(sync_batch_norm, strategy, replicate_variables, all_reduce):
    """Refuses the arguments that ask for what only TensorFlow's path has."""
    refused = [
        (
            "sync_batch_norm",
            sync_batch_norm,
            sync_batch_norm is not True,
            "on JAX, BatchNormalization always uses the global batch's statistics",
        ),
        (
            "strategy",
            strategy,
            strategy is not None,
            "on JAX, one process trains; tf.distribute strategies are TensorFlow's",
        ),
        (
            "replicate_variables",
            replicate_variables,
            replicate_variables not in ("auto", True),
            "on JAX every device holds the variables: 'auto' or True",
        ),
        (
            "all_reduce",
            all_reduce,
            all_reduce is not None,
            "on JAX, XLA chooses the collectives",
        ),
    ]
    for name, value, bad, why in refused:
        if bad:
            raise ValueError(
                f"`{name}` must be left at its default on Keras's JAX backend "
                f"({why}). Received: {name}={value!r}"
            )
