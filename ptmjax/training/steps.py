"""Pure train and eval steps: `(state, batch, rng) -> (state, metrics)`.

The batch is the output of the model family's seqio feature converter. Its
target fields feed the family's loss (`ModelApi.loss`, ptmjax/families/model_api.py);
every other field is passed to the model by name.

The optimised objective is `token loss / normalizer + mean over microbatches
of (batch loss + aux)`, where the normaliser is the number of weighted target
tokens in the whole batch (or LossConfig.normalizing_factor), the batch loss
is the family's per-batch mean (NSP, ELECTRA's discriminator), and aux the sum
of whatever the model sows into the 'losses' collection (MoE load balancing).
So each microbatch's differentiated value is its summed token loss plus
`(batch loss + aux) * normalizer / num_microbatches`, and the gradients are
divided once by the normaliser. The 'moe_aux_loss' metric reports the aux,
token-weighted over microbatches and eval batches; the 'loss' metric does not
include it. A model that sows no aux losses (no MoE layers) has no
'moe_aux_loss' metric: what it sows is fixed when the step is traced.
Layer schedules among the extra state choose the layers each train step runs and each evaluation scores
(ptmjax/training/layer_schedule.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers.pipeline import split_microbatches
from ptmjax.training.extra_state import ExtraState, ParamsView, constrained
from ptmjax.training.layer_schedule import layer_schedules, schedule_variables
from ptmjax.training.loss_scaling import LOSS_SCALE, DynamicLossScale
from ptmjax.training.nonfinite import FINITE
from ptmjax.training.objective import Objective, family_loss
from ptmjax.training.train_state import TrainState
from ptmjax.training.trainable import LeafSelection


def make_train_step(
    api: ModelApi, tx: optax.GradientTransformation, schedule: optax.Schedule,
    loss_config: LossConfig, rules: partitioning.Rules, num_microbatches: int = 1,
    selection: LeafSelection | None = None, extra_state: Sequence[ExtraState] = (),
    params_view: ParamsView | None = None, objective: Objective = family_loss,
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds the train step; jit it with the state and batch shardings.

    Gradients of the summed loss are accumulated over `num_microbatches`
    slices of the batch and divided once by the normaliser, so accumulation
    gives the same update as one large batch. Sown auxiliary losses are added
    once per batch (see the module docstring). A step whose loss or gradient
    norm is not finite keeps the old parameters and optimizer state and
    reports metrics[FINITE] = False (see ptmjax/training/nonfinite.py). As in
    `optax.apply_if_finite`, the new state is not read for the check (a pass
    over all of it and a select cost 3% of T5-small's CPU step); the loop
    checks the whole state before it saves a checkpoint.
    Only the leaves `selection` picks (default: all) are differentiated and
    updated; the others reach `tx` as zero gradients and keep their values
    (ptmjax/training/trainable.py).
    `objective` (default: the family's loss) may read `state.extra` and return
    new values of its entries (ptmjax/training/objective.py); after a finite
    step, those are kept, the new parameters are constrained by those of `extra_state`
    that are ParamsConstraints (pruning masks), and each of `extra_state` then updates its
    entry from them (ptmjax/training/extra_state.py).
    A DynamicLossScale among `extra_state` scales the loss before the gradient and the gradients back;
    a step whose gradients overflow is skipped and counts as finite (ptmjax/training/loss_scaling.py).
    """

    loss_weights = api.family.loss_weights
    scaling = next((slot for slot in extra_state if isinstance(slot, DynamicLossScale)), None)
    schedules = layer_schedules(extra_state)

    def grads_and_stats(step_api, chosen, params, extra, batch, rng, batch_loss_scale):
        """Gradients of the selected leaves (a list), the batch's stats and the extra state after it."""
        def loss_fn(selected):
            token_loss, batch_loss, stats, new = objective(
                step_api, chosen.put(params, selected), batch, loss_config, rng, extra
            )
            loss = token_loss + batch_loss * batch_loss_scale
            return (loss if scaling is None else loss * extra[LOSS_SCALE]["scale"]), (stats, new)
        (_, (stats, new)), grads = jax.value_and_grad(loss_fn, has_aux=True)(chosen.take(params))
        return grads, stats, _with_new_values(extra, new)

    def accumulate(step_api, chosen, params, extra, batch, rng, batch_loss_scale):
        micro = jax.tree.map(lambda x: split_microbatches(x, num_microbatches), batch)

        def body(carry, xs):
            grads, stats, extra = carry
            index, microbatch = xs
            g, s, extra = grads_and_stats(
                step_api, chosen, params, extra, microbatch, jax.random.fold_in(rng, index), batch_loss_scale
            )
            return (jax.tree.map(jnp.add, grads, g), stats + s, extra), None

        zero_grads = [jnp.zeros_like(p) for p in chosen.take(params)]
        first = jax.tree.map(lambda x: x[0], micro)
        stats_shape = jax.eval_shape(lambda: grads_and_stats(step_api, chosen, params, extra, first, rng,
                                                             batch_loss_scale)[1])
        zero_stats = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), stats_shape)
        (grads, stats, extra), _ = jax.lax.scan(
            body, (zero_grads, zero_stats, extra), (jnp.arange(num_microbatches), micro)
        )
        return grads, stats, extra

    def train_step(state: TrainState, batch: Batch, rng: jax.Array):
        chosen = selection or LeafSelection.every(state.params)
        with nn.logical_axis_rules(rules):
            rng = jax.random.fold_in(rng, state.step)
            weights = batch[loss_weights].astype(jnp.float32)
            normalizer = loss_config.normalizing_factor or jnp.maximum(jnp.sum(weights), 1.0)
            batch_loss_scale = normalizer / num_microbatches
            step_api = api.with_variables(schedule_variables(schedules, api.module, state.step, state.extra, True))
            step_grads = functools.partial(grads_and_stats if num_microbatches == 1 else accumulate, step_api)
            grads, stats, new_extra = step_grads(chosen, state.params, state.extra, batch, rng, batch_loss_scale)
            divisor = normalizer if scaling is None else normalizer * state.extra[LOSS_SCALE]["scale"]
            grads = [g / divisor for g in grads]
            # Keeps XLA from fusing the optimizer's elementwise update into the
            # gradient computation, which made AdamW steps 1.5x slower on CPU.
            grads = jax.lax.optimization_barrier(grads)
            all_grads = chosen.put(state.params, grads, rest=jnp.zeros_like)
            metrics = stats.metrics()
            metrics["grad_norm"] = optax.tree.norm(grads)
            metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
            loss_finite, grads_finite = jnp.isfinite(metrics["loss"]), jnp.isfinite(metrics["grad_norm"])
            finite = loss_finite & grads_finite

            def updated():
                updates, opt_state = tx.update(all_grads, state.opt_state, state.params)
                trained = chosen.take(optax.apply_updates(state.params, updates))
                params = constrained(chosen.put(state.params, trained), new_extra, extra_state, params_view)
                extra = {**new_extra, **{slot.name: slot.update(new_extra[slot.name], params, params_view)
                                         for slot in extra_state}}
                return chosen.take(params), opt_state, extra

            # Only the branch taken runs: a finite step pays for no select between new and old state.
            trained, opt_state, extra = jax.lax.cond(
                finite, updated, lambda: (chosen.take(state.params), state.opt_state, state.extra)
            )
        params = chosen.put(state.params, trained)
        metrics[FINITE] = finite
        if scaling is not None:
            used = state.extra[LOSS_SCALE]
            metrics[FINITE] = finite | scaling.overflowed(used, loss_finite, grads_finite)
            metrics[LOSS_SCALE] = used["scale"]
            extra = {**extra, LOSS_SCALE: scaling.after_step(used, finite)}
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state, extra=extra), metrics

    return train_step


def make_eval_step(
    api: ModelApi, loss_config: LossConfig, rules: partitioning.Rules
) -> Callable[[Any, Batch], Stats]:
    """Builds the eval step: summed statistics of one batch, no dropout, the model applied with `variables`
    beside the parameters (a layer schedule's: `schedule_variables`)."""

    def eval_step(params, batch: Batch, variables: dict[str, Any]) -> Stats:
        with nn.logical_axis_rules(rules):
            return api.with_variables(variables).loss(params, batch, loss_config)[2]

    return eval_step


def _with_new_values(extra: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`extra` with the entries an objective returned; raises for an entry the run does not carry."""
    unknown = sorted(set(new) - set(extra))
    if unknown:
        raise ValueError(
            f"the objective returned extra state {unknown}, which the run does not carry (it carries "
            f"{sorted(extra) or 'none'}); give the trainer an ExtraState of that name"
        )
    return {**extra, **new}
