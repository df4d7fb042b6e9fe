"""PoWER-BERT's configuration search (Goyal et al., 2020, step 2): how many positions each layer keeps, learned.

`retention_search(model)` returns an encoder-family sequence classifier with a soft extract layer where
`power_bert` puts its hard one (ptmjax/compress/token_dropping.py): after layer j's attention, the positions
ranked by significance ([CLS] first, padding last, ties to the earlier), the one ranked k is multiplied by
r_j[k] = clip(1 + rate * w_j[k], 0, 1), w the new parameter `soft_retention` [layers, longest input] (zeros at
first: r = 1, so the model computes what the classifier computes). The paper trains r with a learning rate
of its own (1e-3 against BERT's 2e-5); here r shares the run's optimizer, and `rate` scales its steps
instead: under an Adam-type optimizer r moves `rate` times as far per step as a weight of the same
learning rate would. `RetentionSearch(penalty)` is the objective that trains it
with the classifier's weights: the family's loss plus penalty * sum_j j * mass_j, once per batch, where
mass_j = sum of r_j over the input's positions (the paper's lambda * sum_j j * mass(j; r): later layers pay
more). `retention_of` reads the retention the search found, l_j = ceil(mass_j) made non-increasing, for
`power_bert.retention` (`token_dropping_evaluation.searched_retention(model_dir, length)` of a run's folder);
fine-tuning that model from the search's folder (its `soft_retention` is left out as a parameter the model
lacks) is the method's third step.

Why clipping in the forward pass rather than after each update, as the paper's code does: the trainer has no
per-parameter projection, and a weight the penalty pushes below 0 gets no further gradient, so it stays
removed, as a clipped one would.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.compress.token_dropping import base_fields, check_dropping_base, extraction, layer_of
from ptmjax.families.losses import Stats
from ptmjax.families.model_api import Batch, ModelApi
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers.common import HIDDEN_AXES, dtype_kwargs
from ptmjax.layers.positions import check_length
from ptmjax.models.encoder import PostLNLayer

Array = jax.Array
SOFT_RETENTION = "soft_retention"


def retention_search(model: nn.Module, rate: float = 50.0) -> nn.Module:
    """`model` (an encoder-family sequence classifier) with a soft extract layer in each layer, its retention
    weights' steps scaled by `rate` (module docstring)."""
    check_dropping_base(model)
    if is_searching(model):
        raise ValueError(f"{type(model).__name__} already searches its retention; apply retention_search once.")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate <= 0:
        raise ValueError(f"retention_search.rate={rate!r} must be a number > 0, e.g. 50.0")
    return _searching_class(type(model))(**base_fields(model), rate=float(rate))


def is_searching(model: nn.Module) -> bool:
    """Whether `model` is a `retention_search` model."""
    return getattr(type(model), "searches_retention", False)


def soft_scales(score: Array, valid: Array, retained: Array) -> Array:
    """float32 [b, s]: each position's factor retained[rank] (r [s], in [0, 1]), ranked by `score` [b, s] as
    `power_bert` keeps them ([CLS] first, padding (valid False) after every real token, ties to the earlier)."""
    rank_score = jnp.where(valid, score, -1.0).at[:, 0].set(jnp.inf)
    order = jnp.argsort(-jax.lax.stop_gradient(rank_score), axis=-1, stable=True)
    return retained[jnp.argsort(order, axis=-1)]


def retained(weights: Array, rate: float) -> Array:
    """r = clip(1 + rate * w, 0, 1), float32, of `soft_retention` w [layers, longest]."""
    return jnp.clip(1.0 + rate * weights.astype(jnp.float32), 0.0, 1.0)


def masses(weights: Array, rate: float, length: int) -> Array:
    """float32 [layers]: sum_k r_j[k] over the first `length` ranks of `soft_retention` [layers, longest]."""
    return jnp.sum(retained(weights[:, :length], rate), axis=-1)


@dataclasses.dataclass(frozen=True)
class RetentionSearch:
    """The search's objective: the family's loss plus `penalty` * sum_j j * mass_j (module docstring), and the
    masses' sum as the metric `retention_mass`."""

    penalty: float = 1e-3

    def __post_init__(self) -> None:
        if isinstance(self.penalty, bool) or not isinstance(self.penalty, int | float) or self.penalty < 0:
            raise ValueError(f"RetentionSearch.penalty={self.penalty!r} must be a number >= 0, e.g. 1e-3")

    def __call__(
        self, api: ModelApi, params: Any, batch: Batch, loss_config: LossConfig, rng: jax.Array | None,
        extra: Mapping[str, Any],
    ) -> tuple[jax.Array, jax.Array, Stats, dict[str, Any]]:
        """The Objective (ptmjax/training/objective.py)."""
        if SOFT_RETENTION not in params:
            raise ValueError(f"RetentionSearch trains the soft retention of a searching model, not "
                             f"{type(api.module).__name__}; set train.model = @retention_search()")
        token_loss, batch_loss, stats = api.loss(params, batch, loss_config, rng)
        mass = masses(params[SOFT_RETENTION], api.module.rate, batch["input_tokens"].shape[1])
        penalty = self.penalty * jnp.sum(jnp.arange(1, mass.shape[0] + 1, dtype=jnp.float32) * mass)
        stats = stats.merge(Stats.of(retention_mass=(jnp.sum(mass), jnp.ones((), jnp.float32))))
        return token_loss, batch_loss + penalty, stats, {}


def retention_of(weights: Any, rate: float, length: int) -> tuple[int, ...]:
    """l_j = ceil(mass_j) of `soft_retention` for inputs `length` long, at least 1, made non-increasing."""
    counts, last = [], length
    for mass in jax.device_get(masses(jnp.asarray(weights), rate, length)).tolist():
        last = min(last, max(1, math.ceil(mass - 1e-6)))
        counts.append(last)
    return tuple(counts)


@functools.cache
def _searching_class(base: type[nn.Module]) -> type[nn.Module]:
    """`base` with a soft extract layer in every layer (one class per base, so equal models compare equal)."""

    class RetentionSearching(base):
        searches_retention: ClassVar[bool] = True
        rate: float = 50.0

        def setup(self) -> None:
            base.setup(self)
            self.layers = [PostLNLayer(self.config) for _ in range(self.config.layer_groups)]  # layers_{g}
            shape = (self.config.num_layers, self.config.max_sequence_length)
            self.soft_retention = self.param(SOFT_RETENTION, nn.with_logical_partitioning(
                nn.initializers.zeros, (None, None)), shape, dtype_kwargs(self.config)["param_dtype"])

        def __call__(self, input_tokens: Array, token_type_ids: Array | None = None,
                     enable_dropout: bool = False) -> Array:
            """float32 logits [b, num_labels] of the head on [CLS] after the soft extract layers."""
            c = self.config
            check_length(input_tokens.shape[1], c.max_sequence_length, type(self).__name__)
            x = self.embedded(input_tokens, token_type_ids, enable_dropout)
            valid, mask = input_tokens != c.pad_token_id, self.attention_mask(input_tokens, x.dtype)
            for index in range(c.num_layers):
                kept = retained(self.soft_retention[index, :input_tokens.shape[1]], self.rate)

                def extract(output: Array, score: Array, kept=kept) -> Array:
                    return output * soft_scales(score, valid, kept)[..., None].astype(output.dtype)

                with extraction(valid, extract):
                    x = layer_of(self, index)(x, mask, enable_dropout)
            return self.classify(nn.with_logical_constraint(x, HIDDEN_AXES), enable_dropout)

    RetentionSearching.__name__ = RetentionSearching.__qualname__ = f"RetentionSearch{base.__name__}"
    RetentionSearching.__module__ = __name__
    return RetentionSearching
