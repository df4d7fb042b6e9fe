"""Pure train and eval steps: `(state, batch, rng) -> (state, metrics)`.

The batch is the output of a seqio feature converter. Its target fields
(`decoder_target_tokens`, `decoder_loss_weights`) feed the loss; every other
field is passed to the model by name.

Auxiliary losses (e.g. MoE load balancing) are whatever the model sows into
the 'losses' collection; their sum is a per-batch scalar. The train step adds
it once per batch on the scale of the normalised loss: each microbatch's
objective gets `aux * normalizer / num_microbatches` added to its summed token
loss, so after the division by the normaliser the optimised objective is
`token loss / normalizer + mean over microbatches of aux`. The 'loss' metric
stays the token loss alone; 'moe_aux_loss' reports the aux (token-weighted
over microbatches and eval batches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.training.losses import LossConfig, token_cross_entropy
from ptmjax.training.train_state import TrainState

TARGET_FIELDS = ("decoder_target_tokens", "decoder_loss_weights")
Batch = Mapping[str, jax.Array]


class TokenStats(NamedTuple):
    """Sums over the real (weighted) target tokens of a batch."""

    loss: jax.Array
    z_loss: jax.Array
    correct: jax.Array
    tokens: jax.Array
    aux_loss: jax.Array  # sown auxiliary losses times `tokens`, so that it sums like the rest

    def __add__(self, other: "TokenStats") -> "TokenStats":
        return TokenStats(*(a + b for a, b in zip(self, other, strict=True)))

    def metrics(self) -> dict[str, jax.Array]:
        """Per-token averages."""
        tokens = jnp.maximum(self.tokens, 1.0)
        return {
            "loss": self.loss / tokens,
            "z_loss": self.z_loss / tokens,
            "accuracy": self.correct / tokens,
            "num_tokens": self.tokens,
            "moe_aux_loss": self.aux_loss / tokens,
        }


def stats_and_aux_loss(
    model: nn.Module, params: Any, batch: Batch, loss_config: LossConfig,
    dropout_rng: jax.Array | None = None,
) -> tuple[TokenStats, jax.Array | None]:
    """Runs the model on `batch`: summed token losses, and the sum of the sown
    'losses' (a per-batch scalar), or None when the model sows none (dense models).
    """
    inputs = {k: v for k, v in batch.items() if k not in TARGET_FIELDS}
    logits, variables = model.apply(
        {"params": params}, **inputs, enable_dropout=dropout_rng is not None,
        rngs=None if dropout_rng is None else {"dropout": dropout_rng}, mutable=["losses"],
    )
    sown = jax.tree.leaves(variables.get("losses", {}))
    aux = sum(jnp.sum(x.astype(jnp.float32)) for x in sown) if sown else None
    targets = batch["decoder_target_tokens"]
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    loss, z = token_cross_entropy(logits, targets, loss_config.z_loss, loss_config.label_smoothing)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    tokens = jnp.sum(weights)
    stats = TokenStats(
        loss=jnp.sum(loss * weights), z_loss=jnp.sum(z * weights),
        correct=jnp.sum(correct * weights), tokens=tokens,
        aux_loss=jnp.zeros((), jnp.float32) if aux is None else aux * tokens,
    )
    return stats, aux


def token_stats(
    model: nn.Module, params: Any, batch: Batch, loss_config: LossConfig,
    dropout_rng: jax.Array | None = None,
) -> TokenStats:
    """Runs the model on `batch` and sums its token losses."""
    return stats_and_aux_loss(model, params, batch, loss_config, dropout_rng)[0]


def make_train_step(
    model: nn.Module, tx: optax.GradientTransformation, schedule: optax.Schedule,
    loss_config: LossConfig, rules: partitioning.Rules, num_microbatches: int = 1,
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds the train step; jit it with the state and batch shardings.

    Gradients of the summed loss are accumulated over `num_microbatches`
    slices of the batch and divided once by the normaliser, so accumulation
    gives the same update as one large batch. Sown auxiliary losses are added
    once per batch (see the module docstring).
    """

    def grads_and_stats(params, batch, rng, aux_scale):
        def loss_fn(p):
            stats, aux = stats_and_aux_loss(model, p, batch, loss_config, rng)
            return (stats.loss if aux is None else stats.loss + aux * aux_scale), stats
        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return grads, stats

    def accumulate(params, batch, rng, aux_scale):
        micro = jax.tree.map(lambda x: _split_microbatches(x, num_microbatches), batch)

        def body(carry, xs):
            grads, stats = carry
            index, microbatch = xs
            g, s = grads_and_stats(params, microbatch, jax.random.fold_in(rng, index), aux_scale)
            return (jax.tree.map(jnp.add, grads, g), stats + s), None

        zero_grads = jax.tree.map(jnp.zeros_like, params)
        zero_stats = TokenStats(*(jnp.zeros((), jnp.float32) for _ in TokenStats._fields))
        (grads, stats), _ = jax.lax.scan(
            body, (zero_grads, zero_stats), (jnp.arange(num_microbatches), micro)
        )
        return grads, stats

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        with nn.logical_axis_rules(rules):
            rng = jax.random.fold_in(rng, state.step)
            weights = batch["decoder_loss_weights"].astype(jnp.float32)
            normalizer = loss_config.normalizing_factor or jnp.maximum(jnp.sum(weights), 1.0)
            aux_scale = normalizer / num_microbatches
            if num_microbatches == 1:
                grads, stats = grads_and_stats(state.params, batch, rng, aux_scale)
            else:
                grads, stats = accumulate(state.params, batch, rng, aux_scale)
            grads = jax.tree.map(lambda g: g / normalizer, grads)
            # Keeps XLA from fusing the optimizer's elementwise update into the
            # gradient computation, which made AdamW steps 1.5x slower on CPU.
            grads = jax.lax.optimization_barrier(grads)
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
        metrics = stats.metrics()
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(
    model: nn.Module, loss_config: LossConfig, rules: partitioning.Rules
) -> Callable[[Any, Batch], TokenStats]:
    """Builds the eval step: summed token statistics of one batch, no dropout."""

    def eval_step(params, batch: Batch) -> TokenStats:
        with nn.logical_axis_rules(rules):
            return token_stats(model, params, batch, loss_config)

    return eval_step


def _split_microbatches(x: jax.Array, num_microbatches: int) -> jax.Array:
    """[batch, ...] -> [microbatches, batch / microbatches, ...], interleaved.

    Microbatch m takes examples m, m + M, m + 2M, ..., so that each device
    keeps its own examples when the batch dimension is sharded.
    """
    batch = x.shape[0]
    if batch % num_microbatches:
        raise ValueError(
            f"batch size {batch} is not divisible by num_microbatches={num_microbatches}"
        )
    x = x.reshape((batch // num_microbatches, num_microbatches) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
