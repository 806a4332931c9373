"""Per-tower replicas of a model's trainable variables (``replicate_variables``).

Without replicas every tower reads the model's variables from the first
tower's device and sends its gradients back there, so that device moves about
``2 (N-1) * G`` bytes per step for ``N`` towers and ``G`` gradient bytes,
``N`` times the ``2 (N-1)/N * G`` of a ring all-reduce. With
``TowerModel(..., replicate_variables=True)`` a training step runs as
`tf.distribute.MirroredStrategy` does, with kerastower's exact gradients:

1. Tower 0 reads the model's own (primary) variables, which live on its
   device; tower ``i >= 1`` reads its replica ``w_i`` of each trainable
   variable, on its own device (`Replicas.copies`, read through
   `kerastower.step.layer_updates.tower_reads`, a `keras.StatelessScope` that
   maps each primary variable to the replica's value, so the layers run
   unchanged and the tape differentiates the replica).
2. Each tower's weighted gradient ``g_i = (n_i / B) dL_i/dw`` (see
   `kerastower.step.tower_step`) is all-reduced: the dense gradients of one dtype
   are packed into buffers of at most 25 MB (`AllReduceOptions`), each
   summed with one ``CollectiveReduceV2`` (ring on CPUs, NCCL on GPUs with
   ``communication_hint="auto"``), so every tower receives the same
   ``g = sum_i g_i``: the ring's all-gather copies each reduced chunk, so the
   towers' sums are bitwise identical (`kerastower.reduce.ring`); a tower
   traced once on one worker sums its own in its function, with the same
   buckets (`ring_gradients.sum_in_call`). Sparse
   gradients (`tf.IndexedSlices`) are all-gathered as rows, values and
   indices, in tower order (as `MirroredStrategy` gathers them), and each
   tower combines the rows as one device has them
   (`kerastower.reduce.ring_gradients`).
3. Tower 0's sum goes to the model's optimizer as without replicas; tower
   ``i >= 1`` applies its (identical) sum to its replica with its own clone
   of the optimizer (same class and settings, the same learning-rate
   schedule object, the same variables excluded from weight decay, slot
   variables on its device; `kerastower._keras_compat.clone_optimizer`), and
   each replica carries its variable's constraint, which the clone applies
   after the update as Keras's optimizer does.
   Before each update the clone copies the optimizer's scalar state
   (``iterations``, a learning rate a callback may have changed, a loss
   scale) from the model's optimizer, so each replica takes the very update
   the primary takes: ``w_i <- update(w_i, g, state_i) == update(w, g,
   state)`` whenever ``w_i == w`` and ``state_i == state`` before the step.
   The model's optimizer's update is traced once and every tower runs it on
   its own variables (`kerastower.reduce.tower_updates`).
   Under `kerastower.callbacks.GradientAccumulation` each tower adds its sum
   to a window of its own instead, on its device, and applies it when the
   model's window is applied (`GradientWindow.attach`).

A batch smaller than the number of towers runs whole on tower 0 (see
`kerastower.step.tower_runs.TowerRuns.split_run`); the other towers then add
zeros to the same all-reduce. The replicas and the clones' state are copied
from the model (`Replicas.sync`) when they are made, at the start of each
`fit` and after `load_weights`; the model's weights alone (`copy_weights`)
before `evaluate`, `predict` and the ``*_on_batch`` calls and after
`set_weights` (`kerastower.entry_points`).

A `train_step` of one's own applies its gradients itself, to the model's
variables: its replicas have no optimizer clones, and each call of
`TowerModel.tower_gradients` first copies the model's variables to them
(`Replicas.broadcast`, one more ring all-reduce), then returns tower 0's
all-reduced sum (`Replicas.reduce`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kerastower import _keras_compat
from kerastower._keras_compat.family import keras
from kerastower.reduce import ring_gradients
from kerastower.reduce.ring import AllReduceOptions, Ring
from kerastower.reduce.tower_updates import TowerUpdates


class Replicas:
    """Replicas of a model's trainable variables and optimizer on its towers.

    Made by `kerastower.TowerModel` when ``replicate_variables=True``; see the
    module docstring for the step. Tower 0 holds the model's own variables
    and optimizer; towers ``1 .. N-1`` hold a replica of each trainable
    variable and a clone of the optimizer, made by `ensure`.

    Args:
        devices: The ``N`` tower devices, tower 0 first.
        options: How the dense gradients are all-reduced (buckets,
            compression); ``None`` for `AllReduceOptions()`.
        span: On several workers, returns ``(towers, timeout)`` of the ring
            over every worker's towers
            (`kerastower.reduce.workers.replica_span`), asked when the
            replicas are made; ``None`` on one worker.

    Raises:
        ValueError: If `devices` names fewer than 2 towers (1 with `span`).
    """

    def __init__(
        self,
        devices: Sequence[str],
        options: AllReduceOptions | None = None,
        span: Callable[[], tuple[int, float]] | None = None,
    ):
        if len(devices) < (1 if span else 2):
            raise ValueError(
                "`devices` must name at least 2 towers to replicate variables "
                f"over, or 1 on several workers. Received: devices={list(devices)}"
            )
        self.devices = list(devices)
        self.options = options or AllReduceOptions()
        self._span_of = span
        self._span: tuple[int, float] | None = None
        self._key: tuple | None = None
        self._primaries: list[keras.Variable] = []
        self._optimizer: Any = None
        self._copies: list[list[keras.Variable]] = []
        self._clones: list[Any] = []
        self._updates: TowerUpdates | None = None
        self._tokens: list[tf.Variable] = []

    def ensure(
        self, variables: Sequence[keras.Variable], optimizer: Any = None
    ) -> bool:
        """Makes the replicas of `variables` and, given one, clones of `optimizer`.

        Does nothing when they exist for these very variables (and
        optimizer): a new `compile` or a change of ``trainable`` makes new
        ones. Without `optimizer` (a `train_step` of one's own, which applies
        its gradients itself) only the replicas are made, which
        `broadcast` refreshes. Runs eagerly, also while a step is traced; the
        optimizer is built on `variables` first if it is not built yet.

        Returns:
            Whether it made them, and synced them (`sync`).
        """
        key = tuple(id(v) for v in variables)
        made = key == self._key
        if made and (optimizer is None or optimizer is self._optimizer):
            return False
        with tf.init_scope():
            if optimizer is not None and not optimizer.built:
                optimizer.build(list(variables))
            if self._span_of is not None and self._span is None:
                self._span = self._span_of()
            with tf.variable_creator_scope(_one_tensorflow_name):
                if not made:
                    self._make_copies(variables)
                self._clones = (
                    [] if optimizer is None else self._clone(optimizer, variables)
                )
            self._optimizer, self._updates = optimizer, None
            if optimizer is not None:
                self._updates = TowerUpdates(
                    optimizer, self._primaries, self._clones, self._copies, self.devices
                )
            self._key = key
            if made:
                self.sync()
            else:  # replicas made just now hold the weights already
                self._copy_optimizer_state()
        return True

    def _make_copies(self, variables: Sequence[keras.Variable]) -> None:
        self._primaries = list(variables)
        self._tokens = []
        for device in self.devices:
            with tf.device(device):
                # Orders this tower's collectives (as `MirroredStrategy`
                # does); without it, automatic control dependencies chain
                # the towers' collectives, which then wait for each other.
                self._tokens.append(tf.Variable(0.0, trainable=False))
        self._copies = [[] for _ in self.devices[1:]]
        # Entering a variable's name scope costs as much as making it: once
        # for every variable of a layer and every tower.
        for parent, group in itertools.groupby(variables, _parent_path):
            group = list(group)
            with _name_scopes(parent):
                for device, copies in zip(self.devices[1:], self._copies):
                    with tf.device(device):
                        copies.extend(_copy_of(v) for v in group)

    def _clone(self, optimizer: Any, variables: Sequence[keras.Variable]) -> list:
        """A clone of `optimizer` on each tower ``i >= 1``, for its replicas."""
        clones = []
        for device, copies in zip(self.devices[1:], self._copies):
            with tf.device(device):
                clone = _keras_compat.clone_optimizer(optimizer, variables, copies)
            clones.append(clone)
        return clones

    @property
    def tokens(self) -> list[tf.Variable]:
        """One variable per tower that orders its collectives of gradients
        (`kerastower.reduce.ring.Ring`'s ``tokens``)."""
        return list(self._tokens)

    @property
    def built(self) -> bool:
        """Whether `ensure` has made the replicas."""
        return self._key is not None

    def matches(self, variables: Sequence[keras.Variable]) -> bool:
        """Whether the replicas are made, of exactly `variables`."""
        return self.built and [id(v) for v in variables] == [
            id(v) for v in self._primaries
        ]

    def copy_weights(self, variables: Sequence[keras.Variable]) -> None:
        """Copies the model's weights, not its optimizer's state, to every
        replica, if the replicas are of `variables` (see `matches`)."""
        if self.matches(variables):
            self._copy_weights()

    def _copy_weights(self) -> None:
        with tf.init_scope():
            for copies in self._copies:
                for primary, copy in zip(self._primaries, copies):
                    copy.assign(primary.value)

    def replica_variables(self, tower: int) -> list[keras.Variable]:
        """Tower `tower`'s trainable variables: the model's own on tower 0."""
        if not 0 <= tower < len(self.devices):
            raise ValueError(
                f"`tower` must be in [0, {len(self.devices)}). Received: tower={tower}"
            )
        return self._primaries if tower == 0 else self._copies[tower - 1]

    def sync(self) -> None:
        """Copies the model's variables and optimizer state to every replica.

        Runs eagerly. The optimizer must hold the same variables, in the same
        order and shapes, as each clone (it does when built on the model's
        trainable variables, as Keras builds it).

        Raises:
            ValueError: If the model's optimizer does not match its clones.
        """
        if not self.built:
            return
        self._copy_weights()
        self._copy_optimizer_state()

    def _copy_optimizer_state(self) -> None:
        if self._optimizer is None:
            return
        with tf.init_scope():
            primary_state = list(self._optimizer.variables)
            for clone in self._clones:
                state = list(clone.variables)
                shapes = [tuple(v.shape) for v in primary_state]
                if shapes != [tuple(v.shape) for v in state]:
                    raise ValueError(
                        "The model's optimizer must hold state for exactly the "
                        "model's trainable variables to be replicated; build it "
                        "on `model.trainable_variables` or compile again. "
                        f"Received: optimizer state shapes={shapes}, expected "
                        f"{[tuple(v.shape) for v in state]}"
                    )
                for primary, copy in zip(primary_state, state):
                    copy.assign(primary.value)

    def broadcast(self) -> None:
        """Copies the model's variables to every replica, inside a step.

        For a `train_step` of one's own, whose optimizer updates the model's
        variables only (`kerastower.step.custom_step`): one ring all-reduce
        on one worker (`ring_gradients.broadcast`); on several workers,
        whose ring spans every worker's towers, tower 0 copies to this
        worker's other towers.
        """
        if not self._primaries:
            return
        if self._span is None:
            ring = Ring(self.devices, self._tokens)
            values = ring_gradients.broadcast(ring, self._primaries, self.options)
        else:
            values = [[v.value for v in self._primaries]] * len(self.devices)
        for device, copies, tower_values in zip(
            self.devices[1:], self._copies, values[1:]
        ):
            with tf.device(device):
                for copy, value in zip(copies, tower_values):
                    copy.assign(value)

    def copies(
        self, variables: Sequence[keras.Variable], tower: int
    ) -> list[keras.Variable]:
        """Tower `tower`'s replica of each of `variables`, for it to read and
        differentiate (see `kerastower.step.layer_updates.tower_reads`): the
        variable itself where it is not replicated."""
        own = self.replica_variables(tower)
        index = {id(v): j for j, v in enumerate(self._primaries)}
        return [own[index[id(v)]] if id(v) in index else v for v in variables]

    def update(
        self,
        per_tower: Sequence[Sequence[Any]],
        indices: Sequence[int],
        static_rows: Sequence[bool | None] | None = None,
        accumulator: Any = None,
        batch_size: Any = None,
        summed: bool = False,
    ) -> list[Any]:
        """All-reduces the towers' gradients and updates every replica.

        Args:
            per_tower: Each tower's gradients of the variables at `indices`
                (of the replicated list), tower 0 first; one list when the
                batch ran whole on tower 0.
            indices: Which replicated variables the gradients belong to.
            static_rows: Per gradient, `kerastower.reduce.gradients.sum_gradients`'s
                ``static_rows`` for sparse ones (``None``: from the shapes).
            accumulator: A `kerastower.reduce.accumulation.GradientWindow`
                attached to these replicas: each tower ``i >= 1`` then adds
                its sum to its own window (of `batch_size` examples) instead
                of applying it; the accumulator applies the windows.
            batch_size: The micro-batch's global batch size, with
                `accumulator`.
            summed: Whether the towers summed their dense gradients
                already (see `reduce`).

        Returns:
            Tower 0's summed gradients, on its device, for the model's own
            optimizer.
        """
        variables = [self._primaries[j] for j in indices]
        sums = self.reduce(per_tower, variables, static_rows, summed)
        fixed = {j for j, rows in zip(indices, static_rows or []) if rows}
        for tower in range(1, len(self.devices)):
            if accumulator is None:
                self.apply(tower, sums[tower], indices)
            else:
                with tf.device(self.devices[tower]):
                    accumulator.accumulate_replica(
                        tower, sums[tower], indices, batch_size, fixed
                    )
        return sums[0]

    def reduce(
        self,
        per_tower: Sequence[Sequence[Any]],
        variables: Sequence[Any],
        static_rows: Sequence[bool | None] | None = None,
        summed: bool = False,
    ) -> list[list[Any]]:
        """All-reduces the towers' gradients of `variables`; every tower gets
        the sum on its device (see `ring_gradients.all_reduce`).

        `per_tower` holds each tower's gradients, tower 0 first, or one list
        when the batch ran whole on tower 0 (see `every_tower`). With
        `summed`, its dense gradients are each tower's sums already (a tower
        traced once sums them inside, `ring_gradients.sum_in_call`): only
        the sparse ones are gathered.
        """
        per_tower = self.every_tower(per_tower)
        # A dense gradient's static shape can be partly unknown (a `Dense`
        # kernel applied to sequences); packing needs its variable's.
        shaped = []
        for device, grads in zip(self.devices, per_tower):
            with tf.device(device):
                shaped.append([_shaped_like(g, v) for g, v in zip(grads, variables)])
        ring = Ring(self.devices, self._tokens, self._span)
        return ring_gradients.all_reduce(
            ring, shaped, static_rows, self.options, summed
        )

    def every_tower(self, per_tower: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """`per_tower`, with gradients that add nothing for towers that did not run.

        `per_tower` holds each tower's gradients, tower 0 first, or one list
        when the batch ran whole on tower 0: the other towers then add
        nothing (``g + 0 == g``) through the same ring, rather than tower 0
        sending its gradient to each. Both give the same structure, so a
        step can choose between them in a `tf.cond` and all-reduce after it.
        """
        received = len(per_tower)
        per_tower = [list(grads) for grads in per_tower]
        if received == 1:
            for device in self.devices[1:]:
                with tf.device(device):
                    per_tower.append(
                        [ring_gradients.nothing_like(g) for g in per_tower[0]]
                    )
        if len(per_tower) != len(self.devices):
            raise ValueError(
                f"`per_tower` must hold 1 or {len(self.devices)} gradient lists. "
                f"Received: {received}"
            )
        return per_tower

    def apply(self, tower: int, gradients: Sequence[Any], indices: Sequence[int]):
        """Applies `gradients` to tower `tower`'s variables at `indices`.

        Tower 0 applies them with the model's optimizer, tower ``i >= 1``
        with its clone, which first copies the model's optimizer's scalar
        state (``iterations``, the learning rate, a loss scale): apply every
        other tower before tower 0. Each tower's update is the model's
        optimizer's, traced once (`kerastower.reduce.tower_updates`).
        """
        if not indices:  # no variable is connected to the loss
            return
        if tower == 0:  # where the model's variables are
            self._updates.apply(tower, gradients, indices)
            return
        with tf.device(self.devices[tower]):
            self._updates.apply(tower, gradients, indices)

    def apply_first(self, gradients: Sequence[Any]) -> None:
        """Applies tower 0's `gradients`, one per replicated variable
        (``None`` for one the loss does not reach), with the model's
        optimizer, after `update` applied the other towers'."""
        if any(g is None for g in gradients):  # Keras warns of them
            self._optimizer.apply_gradients(zip(gradients, self._primaries))
            return
        self.apply(0, gradients, range(len(gradients)))


def _shaped_like(gradient: Any, variable: Any) -> Any:
    """`gradient`, a dense one with its `variable`'s static shape."""
    if isinstance(gradient, tf.IndexedSlices) or gradient.shape == variable.shape:
        return gradient
    return tf.reshape(gradient, variable.shape)


def _one_tensorflow_name(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
    """Makes a replica's (or its optimizer state's) `tf.Variable` under one
    name, ``kerastower_replica/variable``.

    TensorFlow makes a new kernel for each name and shape of variable that a
    device has not made before: 0.3 ms, most of the time to make a
    variable (DenseNet121 on 8 towers with Adam: 7 x 1,092 replicas and
    slots). Keras variables keep their own name and path, which optimizers
    and users read; only TensorFlow's, shown in its errors, is shared (the
    trailing slash makes the scope absolute: not the layer's).
    """
    with tf.name_scope("kerastower_replica/"):
        return next_creator(**{**kwargs, "name": "variable"})


def _parent_path(variable: keras.Variable) -> str:
    """The path of the layer that holds `variable` (``""`` for none)."""
    return variable.path.rpartition("/")[0]


@contextlib.contextmanager
def _name_scopes(path: str):
    """Keras name scopes in which a variable's path is ``path/<name>``."""
    with contextlib.ExitStack() as scopes:
        for part in path.split("/") if path else ():  # one scope per level
            scopes.enter_context(keras.name_scope(part))
        yield


def _copy_of(variable: keras.Variable) -> keras.Variable:
    """A new variable of `variable`'s value and name, with its constraint.

    Made in the name scopes of `variable`'s parent path (`_name_scopes`),
    it has `variable`'s path: an optimizer that picks by path
    (`keras.optimizers.MultiOptimizer`'s `OptimizerMap`,
    `exclude_from_weight_decay`) treats the copy as the variable.
    """
    copy = keras.Variable(
        tf.identity(variable.value), dtype=variable.dtype, name=variable.name
    )
    copy.constraint = variable.constraint  # the clone applies it, as Keras does
    return copy
