"""The trainer: a model, an optimizer and a mesh, with jitted, sharded steps."""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ptmjax import partitioning
from ptmjax.families import losses
from ptmjax.families.model_api import ModelApi, model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.training import optimizers, steps
from ptmjax.training.extra_state import ExtraState, ParamsConstraint, ParamsView, StoredExtraState, constrained
from ptmjax.training.layer_schedule import layer_schedules, schedule_variables
from ptmjax.training.objective import Objective, StatefulObjective, family_loss
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainable import Trainable
from ptmjax.tree_paths import leaves_by_path


class Trainer:
    """Creates the train state already sharded and runs the jitted steps.

    Parameters and optimizer state are never materialised whole on one
    device: initialisation itself is jitted with the target shardings.
    `trainable`: regular expressions over parameter paths; only matching
    parameters train (ptmjax/training/trainable.py). None trains all.
    `extra_state`: the non-trained state the run carries in `TrainState.extra`
    (ptmjax/training/extra_state.py), e.g. an EMA of the parameters.
    `objective`: what the train step minimises, the family's loss unless another is given; it may read
    and update the extra state (ptmjax/training/objective.py).
    """

    def __init__(
        self, model: nn.Module, tx: optax.GradientTransformation, schedule: optax.Schedule,
        mesh: Mesh, rules: partitioning.Rules, loss_config: LossConfig | None = None,
        num_microbatches: int = 1, trainable: Sequence[str] | None = None,
        extra_state: Sequence[ExtraState] = (), objective: Objective = family_loss,
    ):
        partitioning.validate_rules(rules, mesh.axis_names)
        self.model, self.tx, self.mesh, self.rules = model, tx, mesh, rules
        self.api = api = model_api(model)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batch_sharding = partitioning.batch_sharding(mesh)

        self.logical_axes, param_shardings = api.logical_axes, self._shardings(api)
        # The optimizer sees a scanned model's layers unscanned (optimizers.on_unscanned_layout):
        # its state's leaves mirror the unscanned parameters.
        plain = api.unscanned()
        self.optimizer_view = (plain.abstract_params, plain.logical_axes)
        self.trainable = Trainable(None if trainable is None else tuple(trainable))
        self.tx = tx = self.trainable.optimizer(tx, plain.abstract_params)
        abstract_opt_state = jax.eval_shape(tx.init, plain.abstract_params)
        optimizer_rules = partitioning.optimizer_rules(rules, mesh)  # with stages: the state split over them too
        plain_shardings = param_shardings if plain is api and optimizer_rules is rules else self._shardings(
            plain, optimizer_rules)
        opt_shardings = partitioning.optimizer_state_shardings(
            tx, abstract_opt_state, *(self.trainable.masked(tree, plain.abstract_params)
                                      for tree in (plain.abstract_params, plain_shardings)), mesh,
        )
        if api.scanning:
            laid_out = None if optimizer_rules is rules else self._shardings(api, optimizer_rules)
            self.tx = tx = optimizers.on_unscanned_layout(tx, api.scanning, laid_out)
        selection = self.trainable.selection(plain.abstract_params, api.scanning)
        # The parameter paths (in the model's own layout) the train step differentiates and updates.
        self.trained_paths = tuple(
            path for (path, _), trains in zip(leaves_by_path(api.abstract_params), selection.flags, strict=True)
            if trains
        )
        self.extra_state, self.objective = tuple(extra_state), objective
        self.params_view = view = ParamsView(
            api.abstract_params, param_shardings, self.logical_axes, self.trained_paths, mesh, rules
        )
        self.state_shardings = TrainState(
            step=self.replicated, params=param_shardings, opt_state=opt_shardings,
            extra={slot.name: slot.shardings(view) for slot in self.extra_state},
        )
        self.abstract_state = TrainState(
            step=jax.ShapeDtypeStruct((), jnp.int32), params=api.abstract_params,
            opt_state=abstract_opt_state, extra={slot.name: slot.abstract(view) for slot in self.extra_state},
        )

        loss_config = loss_config or LossConfig()
        train_step = steps.make_train_step(api, tx, schedule, loss_config, rules, num_microbatches, selection,
                                           self.extra_state, view, objective)
        self._train_step = jax.jit(
            train_step,
            in_shardings=(self.state_shardings, self.batch_sharding, self.replicated),
            out_shardings=(self.state_shardings, self.replicated),
            donate_argnums=(0,),
        )
        self._eval_step = jax.jit(
            steps.make_eval_step(api, loss_config, rules),
            in_shardings=(param_shardings, self.batch_sharding, self.replicated),
            out_shardings=self.replicated,
        )

    @property
    def _run_once_options(self) -> dict[str, int]:
        """XLA options for the programs a run calls once (initialisation). On the CPU, LLVM at -O1 compiles
        them in about two thirds of the time with the same values and no slower a run: demo 4.3 -> 2.9 s,
        T5 v1.1 base 22 -> 18.7 s (docs/performance_log.md)."""
        return {"xla_backend_optimization_level": 1} if self.mesh.devices.flat[0].platform == "cpu" else {}

    def _shardings(self, api: ModelApi, rules: partitioning.Rules | None = None) -> Any:
        """The shardings that the rules (the run's unless given) give `api`'s parameters on the mesh."""
        with jax.set_mesh(self.mesh):
            return partitioning.logical_shardings(api.boxed_abstract_params, self.mesh, rules or self.rules)

    def init_state(self, rng: jax.Array) -> TrainState:
        """A fresh state, created directly in its sharded layout."""

        shardings = self.state_shardings.replace(extra=self._computed_extra_shardings)

        @functools.partial(jax.jit, out_shardings=shardings, compiler_options=self._run_once_options)
        def init(rng):
            params, extra = self._init_extra(nn.unbox(self.api.init(rng)))
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params),
                              extra=extra)

        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            state = init(rng)
        state = state.replace(extra={**state.extra, **self._read_extra()})
        if isinstance(self.objective, StatefulObjective):
            with jax.set_mesh(self.mesh):
                params = self.objective.initial_params(state.params, state.extra)
            if params is not None:
                state = self.with_params(state, params)
        return state

    def with_params(self, state: TrainState, params: Any) -> TrainState:
        """`state` (a fresh one) starting from other `params` (an init checkpoint's), constrained and its extra
        state initialised from them (the stored entries as they were read)."""
        if not self._computed_extra:
            return state.replace(params=params)
        init = jax.jit(self._init_extra, out_shardings=(self.state_shardings.params, self._computed_extra_shardings),
                       compiler_options=self._run_once_options)
        with jax.set_mesh(self.mesh):
            params, extra = init(params)
        return state.replace(params=params, extra={**state.extra, **extra})

    @property
    def _computed_extra(self) -> tuple[ExtraState, ...]:
        """The extra state computed from the parameters; the rest is read from storage (StoredExtraState)."""
        return tuple(slot for slot in self.extra_state if not isinstance(slot, StoredExtraState))

    @property
    def _computed_extra_shardings(self) -> dict[str, Any]:
        return {slot.name: self.state_shardings.extra[slot.name] for slot in self._computed_extra}

    def _init_extra(self, params: Any) -> tuple[Any, dict[str, Any]]:
        """The initial parameters under the run's constraints (ParamsConstraint, e.g. pruning masks, first
        initialised from them), and the computed extra state: the rest initialised from the constrained ones."""
        view = self.params_view
        constraints = {slot.name: slot.init(params, view) for slot in self._computed_extra
                       if isinstance(slot, ParamsConstraint)}
        params = constrained(params, constraints, self.extra_state, view)
        return params, {**constraints, **{slot.name: slot.init(params, view) for slot in self._computed_extra
                                          if slot.name not in constraints}}

    def _read_extra(self) -> dict[str, Any]:
        with jax.set_mesh(self.mesh):
            return {slot.name: slot.read(self.params_view) for slot in self.extra_state
                    if isinstance(slot, StoredExtraState)}

    def init_around(self, rng: jax.Array, present: Any) -> Any:
        """The parameters: `present` (some of them, laid out as the trainer's) and the rest initialised around
        them (`ModelApi.init_around`), created directly in their sharded layout."""
        init = jax.jit(self.api.init_around, out_shardings=self.state_shardings.params,
                       compiler_options=self._run_once_options)
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return init(rng, present)

    def train_step(
        self, state: TrainState, batch: steps.Batch, rng: jax.Array
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer update on a global batch; donates `state`."""
        with jax.set_mesh(self.mesh):
            return self._train_step(state, batch, rng)

    def lower_train_step(
        self, state: TrainState, batch: steps.Batch, rng: jax.Array
    ) -> jax.stages.Lowered:
        """The jitted train step lowered for these arguments (arrays or ShapeDtypeStructs with shardings),
        ready to `.compile()`: what `ptmjax compile` compiles for a TPU topology."""
        with jax.set_mesh(self.mesh):
            return self._train_step.lower(state, batch, rng)

    @functools.cached_property
    def sharded_abstract_state(self) -> TrainState:
        """The state as ShapeDtypeStructs with its shardings: what `lower_train_step` takes in place of arrays."""
        return jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
                            self.abstract_state, self.state_shardings)

    def compile_train_step(self, batch: Mapping[str, jax.ShapeDtypeStruct], rng: jax.Array) -> None:
        """Compiles the train step (or loads it from JAX's persistent compilation cache) for the state and
        batches of `batch`'s shapes, dtypes and shardings (e.g. `RunSpec.abstract_batch`) without running it.
        A first `train_step` on such a batch then finds it in JAX's in-memory caches; on any other batch it
        compiles its own program, as it would have anyway."""
        self.lower_train_step(self.sharded_abstract_state, batch, rng).compile()

    def start_compiling_train_step(
        self, batch: Mapping[str, jax.ShapeDtypeStruct], rng: jax.Array
    ) -> concurrent.futures.Future[None]:
        """`compile_train_step` in a thread of its own, so that the caller's thread goes on meanwhile (on a
        2-core CPU, initialising the demo's state and building its input pipeline beside the compile takes
        2 to 3 s off a cold start); the future's `result()` waits for it and raises its error."""
        compiler = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ptmjax-compile")
        compiled = compiler.submit(self.compile_train_step, batch, rng)
        compiler.shutdown(wait=False)  # its thread ends with the compile
        return compiled

    def eval_stats(self, params: Any, batch: steps.Batch, state: TrainState | None = None) -> losses.Stats:
        """Summed statistics of one global batch; given the run's `state`, with the layers its layer schedules
        leave active (ptmjax/training/layer_schedule.py), else with all."""
        with jax.set_mesh(self.mesh):
            variables = {} if state is None else schedule_variables(
                layer_schedules(self.extra_state), self.model, state.step, state.extra, train=False
            )
            return self._eval_step(params, batch, variables)
