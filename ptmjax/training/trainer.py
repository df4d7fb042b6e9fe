"""The trainer: a model, an optimizer and a mesh, with jitted, sharded steps."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ptmjax import partitioning
from ptmjax.layers import layer_stack
from ptmjax.training import model_losses, optimizers, steps
from ptmjax.training.architectures import architecture_of
from ptmjax.training.losses import LossConfig
from ptmjax.training.train_state import TrainState


def init_params(model: nn.Module, rng: jax.Array) -> Any:
    """The model's parameters, boxed with their logical axes (nn.Partitioned).

    A one-token dummy batch suffices: parameter shapes do not depend on length.
    Under `jax.eval_shape` this allocates nothing.
    """
    architecture = architecture_of(model)
    tokens = jnp.ones((1, 1), jnp.int32)
    inputs = {name: tokens for name in architecture.init_fields}
    rngs = {"params": rng, **steps.model_rngs(architecture, rng, train=False)}
    return model.init(rngs, **inputs)["params"]


class Trainer:
    """Creates the train state already sharded and runs the jitted steps.

    Parameters and optimizer state are never materialised whole on one
    device: initialisation itself is jitted with the target shardings.
    """

    def __init__(
        self, model: nn.Module, tx: optax.GradientTransformation, schedule: optax.Schedule,
        mesh: Mesh, rules: partitioning.Rules, loss_config: LossConfig | None = None,
        num_microbatches: int = 1,
    ):
        partitioning.validate_rules(rules)
        self.model, self.tx, self.mesh, self.rules = model, tx, mesh, rules
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.batch_sharding = partitioning.batch_sharding(mesh)

        self.logical_axes, abstract_params, param_shardings = self._abstract_params(model)
        # The optimizer sees a scanned model's layers unscanned (optimizers.on_unscanned_layout).
        scanning = layer_stack.scanning_config(model)
        plain_axes, plain_params, plain_shardings = self.logical_axes, abstract_params, param_shardings
        if scanning:
            plain_axes, plain_params, plain_shardings = self._abstract_params(
                layer_stack.with_scan_layers(model, False)
            )
        # What the optimizer state's leaves mirror: abstract parameters and their logical axes.
        self.optimizer_view = (plain_params, plain_axes)
        abstract_opt_state = jax.eval_shape(tx.init, plain_params)
        opt_shardings = partitioning.optimizer_state_shardings(
            tx, abstract_opt_state, plain_params, plain_shardings, mesh
        )
        if scanning:
            self.tx = tx = optimizers.on_unscanned_layout(tx, scanning)
        self.state_shardings = TrainState(
            step=self.replicated, params=param_shardings, opt_state=opt_shardings
        )
        self.abstract_state = TrainState(
            step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
            opt_state=abstract_opt_state,
        )

        loss_config = loss_config or LossConfig()
        train_step = steps.make_train_step(model, tx, schedule, loss_config, rules, num_microbatches)
        self._train_step = jax.jit(
            train_step,
            in_shardings=(self.state_shardings, self.batch_sharding, self.replicated),
            out_shardings=(self.state_shardings, self.replicated),
            donate_argnums=(0,),
        )
        self._eval_step = jax.jit(
            steps.make_eval_step(model, loss_config, rules),
            in_shardings=(param_shardings, self.batch_sharding),
            out_shardings=self.replicated,
        )

    def _abstract_params(self, model: nn.Module) -> tuple[Any, Any, Any]:
        """The model's logical axes, abstract parameters and parameter shardings."""
        boxed_params = jax.eval_shape(functools.partial(init_params, model), jax.random.key(0))
        with jax.set_mesh(self.mesh):
            shardings = partitioning.logical_shardings(boxed_params, self.mesh, self.rules)
        return nn.get_partition_spec(boxed_params), nn.unbox(boxed_params), shardings

    def init_state(self, rng: jax.Array) -> TrainState:
        """A fresh state, created directly in its sharded layout."""

        @functools.partial(jax.jit, out_shardings=self.state_shardings)
        def init(rng):
            params = nn.unbox(init_params(self.model, rng))
            return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params))

        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return init(rng)

    def train_step(
        self, state: TrainState, batch: steps.Batch, rng: jax.Array
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimizer update on a global batch; donates `state`."""
        with jax.set_mesh(self.mesh):
            return self._train_step(state, batch, rng)

    def eval_stats(self, params: Any, batch: steps.Batch) -> model_losses.Stats:
        """Summed statistics of one global batch."""
        with jax.set_mesh(self.mesh):
            return self._eval_step(params, batch)
