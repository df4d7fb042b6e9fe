"""Mixture-of-Experts feed-forward layer: Switch (top-1) and GShard (top-2) routing.

Tokens are routed in groups, one group per batch row, so routing never depends
on the mesh or on how the batch is split into microbatches. Within a group each
expert takes at most `capacity` tokens,

    capacity = ceil(tokens_per_group * top_k * capacity_factor / num_experts),

filled in order: first every token's first choice (in sequence order), then
every token's second choice. A token whose choice is full is dropped for that
expert; a token dropped by all its choices gets a zero output, so in a T5
block it passes through the residual unchanged. Padding tokens are routed and
counted like real ones (the layer sees no mask).

Gates: top-1 uses the router's softmax probability of the chosen expert
(Switch); top-k > 1 renormalises the k chosen probabilities to sum to 1
(GShard). Dispatch and combine are one-hot tensors [group, token, expert,
capacity] applied with einsums; the expert-side activations are constrained to
'activation_expert' (experts) and 'activation_expert_group' (groups), so when
the rules map experts to a mesh axis the tokens move there by all-to-all.

Dropless (`dropless=True`, MoeConfig.moe_dropless): every token reaches all its top-k experts,
no capacity. The (token, choice) rows of the batch are sorted by expert and each expert's
feed-forward runs on its contiguous rows with grouped matmuls (`jax.lax.ragged_dot`); routing and
gates are those of the groups, as above (a row's result depends only on its token and expert).
It equals the capacity-based layer whenever that drops nothing; the capacity factors are unused.
Inside a mesh the sorted rows are split over the batch's devices and each device gathers every
expert's kernels for its slice (`layers/grouped_matmul.py`): FSDP's weight traffic instead of the
capacity path's all-to-all of tokens, and no device holds more than its share of the rows.

Auxiliary losses, sown (already weighted) into the 'losses' collection:
- 'load_balancing_loss': num_experts * sum_e f_e * P_e, averaged over groups,
  where f_e is the fraction of the group's tokens whose *first* choice is e and
  P_e the mean router probability of e. It is 1 for perfectly balanced routing,
  whatever top_k (GShard's convention; Switch's for top-1).
- 'router_z_loss': mean over tokens of logsumexp(router_logits)**2 (ST-MoE).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import precision
from ptmjax.layers.common import DType
from ptmjax.layers.grouped_matmul import grouped_matmul
from ptmjax.layers.layer_stack import LayerStackConfig
from ptmjax.layers.mlp import ACTIVATIONS, check_activations

Array = jax.Array

TOKEN_AXES = ("activation_batch", "activation_length", "activation_embed")
# Expert side: [group, expert, capacity, embed|mlp].
EXPERT_AXES = ("activation_expert_group", "activation_expert", None, "activation_embed")
EXPERT_HIDDEN_AXES = ("activation_expert_group", "activation_expert", None, "activation_mlp")
# Back on the token side, before combining: [group, expert, capacity, embed].
RETURN_AXES = ("activation_batch", None, None, "activation_embed")
# Dropless: the expert-sorted (token, choice) rows [rows, embed|mlp], split as the batch is.
ROW_AXES = ("activation_batch", None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeConfig(LayerStackConfig):
    """Mixture-of-Experts options of a model config (T5Config, GPT2Config); num_experts=0 keeps every layer dense.

    num_experts: experts in each MoE feed-forward layer (0 = dense model, else >= 2).
    moe_every: layer i (0-based) of each stack is MoE when (i + 1) % moe_every == 0,
      so 2 makes layers 1, 3, 5, ... MoE (Switch's "every other FFN"); 1 makes all MoE.
    moe_top_k: experts per token, 1 = Switch, 2 = GShard (gates renormalised).
    moe_train_capacity_factor / moe_eval_capacity_factor: expert capacity multipliers in
      training (enable_dropout=True) and in eval/inference (enable_dropout=False).
    moe_load_balancing_loss_weight / moe_router_z_loss_weight: weights of the auxiliary
      losses the layers sow into the 'losses' collection (added by the train step).
    moe_jitter_noise: multiplicative U(1-eps, 1+eps) noise on router inputs in training.
    moe_dropless: every token reaches its top-k experts through grouped matmuls
      (`jax.lax.ragged_dot`), no capacity (see the module docstring).

    A subclass names its layer stacks in `layer_stacks()`; layer i of each is an MoE layer when
    `is_moe_layer(i)`, and a scanned stack steps over periods of `moe_every` layers.
    """

    num_experts: int = 0
    moe_every: int = 2
    moe_top_k: int = 1
    moe_train_capacity_factor: float = 1.25
    moe_eval_capacity_factor: float = 2.0
    moe_load_balancing_loss_weight: float = 1e-2
    moe_router_z_loss_weight: float = 1e-3
    moe_jitter_noise: float = 0.0
    moe_dropless: bool = False

    def layer_fields(self, index: int) -> dict[str, Any]:
        return {"use_moe": self.is_moe_layer(index)}

    @property
    def scan_period(self) -> int:
        return self.moe_every if self.num_experts else 1

    def check_layer_stacks(self) -> None:
        self.check_moe()
        super().check_layer_stacks()

    def is_moe_layer(self, index: int) -> bool:
        """Whether layer `index` (0-based, in any stack) has an MoE feed-forward block."""
        return self.num_experts > 0 and (index + 1) % self.moe_every == 0

    def check_moe(self) -> None:
        """Raise ValueError naming the bad MoE field and the fix."""
        owner, n = type(self).__name__, self.num_experts
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or n == 1:
            raise ValueError(f"{owner}.num_experts must be 0 (dense) or an int >= 2, got {n!r}.")
        if n == 0:
            return
        if not isinstance(self.moe_every, int) or self.moe_every < 1:
            raise ValueError(f"{owner}.moe_every must be an int >= 1, got {self.moe_every!r}; 2 = every other layer.")
        if not isinstance(self.moe_top_k, int) or not 1 <= self.moe_top_k <= n:
            raise ValueError(f"{owner}.moe_top_k={self.moe_top_k!r} must be an int in [1, num_experts={n}].")
        for name in ("moe_train_capacity_factor", "moe_eval_capacity_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{owner}.{name} must be > 0, got {getattr(self, name)!r}; Switch uses 1.25 / 2.0.")
        for name in ("moe_load_balancing_loss_weight", "moe_router_z_loss_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{owner}.{name} must be >= 0, got {getattr(self, name)!r}.")
        if not 0.0 <= self.moe_jitter_noise < 1.0:
            raise ValueError(f"{owner}.moe_jitter_noise must be in [0, 1), got {self.moe_jitter_noise!r}.")
        if self.layerdrop or self.decoder_layerdrop:
            rate = "layerdrop" if self.layerdrop else "decoder_layerdrop"
            raise ValueError(
                f"{owner}.{rate}={getattr(self, rate)!r} with num_experts={n}: a dropped MoE layer's auxiliary "
                "losses would still train its router; set layerdrop and decoder_layerdrop to 0 or num_experts=0."
            )
        depths = self.layer_stacks().values()
        if not any(self.is_moe_layer(i) for i in range(max(depths))):
            raise ValueError(
                f"{owner}.moe_every={self.moe_every} selects no layer of stacks with {sorted(depths)} layers; "
                "lower moe_every or set num_experts=0."
            )

    def moe_block(self, d_ff: int, activations: tuple[str, ...], dropout_rate: float, **module_kwargs) -> MoeBlock:
        """The MoeBlock these options describe; `module_kwargs` are name, dtype and param_dtype."""
        return MoeBlock(self, d_ff, activations, dropout_rate, **module_kwargs)


def expert_capacity(tokens_per_group: int, top_k: int, capacity_factor: float, num_experts: int) -> int:
    """ceil(tokens_per_group * top_k * capacity_factor / num_experts), at least 1."""
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}; Switch uses 1.25 (train), 2.0 (eval).")
    return max(1, math.ceil(tokens_per_group * top_k * capacity_factor / num_experts))


class Routing(NamedTuple):
    """Where each token goes. G groups, S tokens per group, E experts, C capacity."""

    dispatch: Array  # [G, S, E, C] 0/1: token s sits in slot c of expert e
    combine: Array  # [G, S, E, C] dispatch times the token's gate for that expert
    probs: Array  # [G, S, E] float32 router softmax
    first_choice: Array  # [G, S] int expert index of each token's top choice


def route(router_logits: Array, top_k: int, capacity: int) -> Routing:
    """Top-k routing with per-expert capacity; `router_logits` [G, S, E] float32."""
    groups, tokens, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]; use 1 (Switch) or 2 (GShard).")
    probs = jax.nn.softmax(router_logits, axis=-1)
    gates, index = jax.lax.top_k(probs, top_k)  # [G, S, K]
    if top_k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    choice = jax.nn.one_hot(index, num_experts, dtype=jnp.int32)  # [G, S, K, E]
    # Priority order: all first choices, then all second choices, each in token order.
    ordered = jnp.swapaxes(choice, 1, 2).reshape(groups, top_k * tokens, num_experts)
    position = (jnp.cumsum(ordered, axis=1) - 1) * ordered  # slot index where chosen
    position = jnp.swapaxes(position.reshape(groups, top_k, tokens, num_experts), 1, 2)  # [G, S, K, E]
    slots = jax.nn.one_hot(position, capacity, dtype=jnp.float32)  # [G, S, K, E, C]; slot >= C -> all zero
    slots = slots * choice[..., None]
    dispatch = jnp.sum(slots, axis=2)  # distinct experts per token, so entries stay 0/1
    combine = precision.einsum("gskec,gsk->gsec", slots, gates)
    return Routing(dispatch, combine, probs, index[..., 0])


def load_balancing_loss(probs: Array, first_choice: Array) -> Array:
    """E * sum_e (fraction of tokens first-routed to e) * (mean prob of e), mean over groups; 1 if balanced."""
    num_experts = probs.shape[-1]
    fraction = jnp.mean(jax.nn.one_hot(first_choice, num_experts, dtype=jnp.float32), axis=1)  # [G, E]
    mean_prob = jnp.mean(probs, axis=1)  # [G, E]
    return num_experts * jnp.mean(jnp.sum(fraction * mean_prob, axis=-1))


def router_z_loss(router_logits: Array) -> Array:
    """Mean over tokens of logsumexp(logits)**2; `router_logits` [G, S, E]."""
    return jnp.mean(jnp.square(jax.nn.logsumexp(router_logits, axis=-1)))


class MoeBlock(nn.Module):
    """Switch/GShard feed-forward block [b, l, embed] -> [b, l, embed], one routing group per row.

    Attributes:
      moe: the model config's MoE options (`MoeConfig`: num_experts >= 2, moe_top_k, the capacity
        factors, the sown losses' weights, jitter noise, dropless). Training is `enable_dropout=True`
        (the train step always passes it, also with dropout_rate 0); eval, scoring and inference pass
        False. Jitter noise is drawn from the 'dropout' rng.
      d_ff: hidden size of each expert.
      activations: as `MlpBlock`: ('relu',) or gated, e.g. ('gelu', 'linear').
      dropout_rate: dropout on the expert hidden activations in training.
    """

    moe: MoeConfig
    d_ff: int
    activations: tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.0
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    def _router_logits(self, x: Array, enable_dropout: bool) -> Array:
        """x [G, S, embed] -> float32 logits [G, S, E]; the router always runs in float32."""
        x32 = jnp.asarray(x, jnp.float32)
        eps = self.moe.moe_jitter_noise
        if enable_dropout and eps > 0:
            noise = jax.random.uniform(self.make_rng("dropout"), x32.shape, jnp.float32, 1.0 - eps, 1.0 + eps)
            x32 = x32 * noise
        # Small init (0.1 x the usual fan-in scale), as Switch recommends for stability.
        init = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal")
        kernel = self.param(
            "router", nn.with_logical_partitioning(init, ("embed", "router_expert")),
            (x.shape[-1], self.moe.num_experts), self.param_dtype,
        )
        return precision.einsum("gsd,de->gse", x32, jnp.asarray(kernel, jnp.float32))

    def _expert_kernel(self, name: str, shape: tuple[int, int], axes: tuple[str, str]) -> Array:
        """A [expert, in, out] kernel, fan-in scaled per expert, cast to the compute dtype."""
        init = nn.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1, batch_axis=(0,)
        )
        shape = (self.moe.num_experts,) + shape
        kernel = self.param(name, nn.with_logical_partitioning(init, ("expert",) + axes), shape, self.param_dtype)
        return jnp.asarray(kernel, self.dtype)

    @nn.compact
    def __call__(self, x: Array, enable_dropout: bool = False) -> Array:
        check_activations(self.activations)
        if self.moe.num_experts < 2:
            raise ValueError(
                f"MoeBlock needs num_experts >= 2, got {self.moe.num_experts}; use MlpBlock for a dense layer."
            )
        groups, tokens, embed = x.shape
        x = nn.with_logical_constraint(jnp.asarray(x, self.dtype), TOKEN_AXES)
        logits = self._router_logits(x, enable_dropout)  # [G, S, E]
        if self.moe.moe_dropless:
            return self._dropless(x, logits, enable_dropout)
        factor = self.moe.moe_train_capacity_factor if enable_dropout else self.moe.moe_eval_capacity_factor
        capacity = expert_capacity(tokens, self.moe.moe_top_k, factor, self.moe.num_experts)

        routing = route(logits, self.moe.moe_top_k, capacity)
        self._sow_losses(logits, routing.probs, routing.first_choice)
        routed = jnp.sum(routing.dispatch, axis=(2, 3))  # [G, S] choices kept per token
        dropped = jnp.mean((routed < self.moe.moe_top_k).astype(jnp.float32))  # tokens that lost a choice
        self.sow("intermediates", "dropped_fraction", dropped)

        dispatch = routing.dispatch.astype(self.dtype)
        expert_in = precision.einsum("gsec,gsd->gecd", dispatch, x)  # [G, E, C, embed]
        expert_in = nn.with_logical_constraint(expert_in, EXPERT_AXES)  # all-to-all to the experts
        expert_out = self._experts(
            expert_in, lambda a, w: precision.einsum("gecd,edf->gecf", a, w), EXPERT_HIDDEN_AXES, enable_dropout
        )
        expert_out = nn.with_logical_constraint(expert_out, EXPERT_AXES)
        expert_out = nn.with_logical_constraint(expert_out, RETURN_AXES)  # all-to-all back to the tokens
        out = precision.einsum("gecd,gsec->gsd", expert_out, routing.combine.astype(self.dtype))  # [G, S, embed]
        return nn.with_logical_constraint(out, TOKEN_AXES)

    def _sow_losses(self, logits: Array, probs: Array, first_choice: Array) -> None:
        """The weighted auxiliary losses of router logits [G, S, E] into 'losses'."""
        balance = load_balancing_loss(probs, first_choice)
        self.sow("losses", "load_balancing_loss", self.moe.moe_load_balancing_loss_weight * balance)
        self.sow("losses", "router_z_loss", self.moe.moe_router_z_loss_weight * router_z_loss(logits))

    def _experts(
        self, expert_in: Array, matmul: Callable[[Array, Array], Array], hidden_axes: tuple[str | None, ...] | None,
        enable_dropout: bool,
    ) -> Array:
        """Each expert's feed-forward on its inputs [..., embed] -> [..., embed]; `matmul(inputs, kernel)`
        applies the [expert, in, out] kernels, `hidden_axes` constrains the hidden activations."""
        embed = expert_in.shape[-1]
        hidden = None
        for i, name in enumerate(self.activations):
            layer = "wi" if len(self.activations) == 1 else f"wi_{i}"
            wi = self._expert_kernel(layer, (embed, self.d_ff), ("embed", "mlp"))
            h = ACTIVATIONS[name](matmul(expert_in, wi))  # [..., mlp]
            hidden = h if hidden is None else hidden * h
        if hidden_axes is not None:
            hidden = nn.with_logical_constraint(hidden, hidden_axes)
        hidden = nn.Dropout(self.dropout_rate)(hidden, deterministic=not enable_dropout)
        wo = self._expert_kernel("wo", (self.d_ff, embed), ("mlp", "embed"))
        return matmul(hidden, wo)

    def _dropless(self, x: Array, logits: Array, enable_dropout: bool) -> Array:
        """x [G, S, embed] through every token's top-k experts by grouped matmuls -> [G, S, embed]."""
        groups, tokens, embed = x.shape
        probs = jax.nn.softmax(logits, axis=-1)
        gates, index = jax.lax.top_k(probs, self.moe.moe_top_k)  # [G, S, K]
        if self.moe.moe_top_k > 1:
            gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        self._sow_losses(logits, probs, index[..., 0])
        self.sow("intermediates", "dropped_fraction", jnp.zeros((), jnp.float32))
        experts = index.reshape(-1)  # [G*S*K] the expert of each (token, choice) row
        order = jnp.argsort(experts, stable=True)  # rows sorted by expert
        rows = jnp.repeat(x.reshape(groups * tokens, embed), self.moe.moe_top_k, axis=0)[order]  # [G*S*K, embed]
        rows = nn.with_logical_constraint(rows, ROW_AXES)
        sizes = jnp.bincount(experts, length=self.moe.num_experts).astype(jnp.int32)  # [E] rows per expert
        out_rows = self._experts(rows, lambda a, w: grouped_matmul(a, w, sizes), ROW_AXES, enable_dropout)
        out_rows = out_rows[jnp.argsort(order)]  # back to (token, choice) order
        choices = out_rows.reshape(groups, tokens, self.moe.moe_top_k, embed)
        out = precision.einsum("gskd,gsk->gsd", choices, gates.astype(self.dtype))
        return nn.with_logical_constraint(out, TOKEN_AXES)
