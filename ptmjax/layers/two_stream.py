"""Two-stream attention (XLNet, MPNet): one transformer layer run over a content and a query stream.

Both streams read the content stream's keys and values, with the same parameters. What a row may
see is set by a factorisation order: every content slot holds either a real token or a mask token
standing for one, and has the `step` of the order at which that token is predicted. A row attends
at a `level`: to the real tokens of step < level and to the mask tokens of step >= level, so it
always sees one thing at every position (MPNet's position compensation; XLNet has no mask tokens).
- XLNet (`two_stream_masks`): the content row of rank r attends at level r + 1, the query row at r.
- MPNet (`masked_permutation_masks`): content slots [x_1..x_n in permuted order, then a mask token
  for each of the last b]; the first c = n - b are never predicted. The content rows of the
  unpredicted tokens and of the mask tokens attend at level c, the content row of the predicted
  token of step t at t + 1, and the query of step t at t.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import NEG_INF
from ptmjax.layers.common import HIDDEN_AXES, dtype_kwargs
from ptmjax.layers.mlp import MlpBlock
from ptmjax.layers.norms import LayerNorm

Array = jax.Array


def visible_keys(levels: Array, steps: Array, is_mask: Array, valid: Array) -> Array:
    """levels [b, q]; the keys' steps [b, k], is_mask [b, k] and valid [b, k] (bool) -> bool [b, 1, q, k]:
    a key is visible at a level when it is valid and a real token of step < level or a mask of step >= level."""
    level, step, mask = levels[:, :, None], steps[:, None, :], is_mask[:, None, :]
    return (jnp.where(mask, step >= level, step < level) & valid[:, None, :])[:, None]


def two_stream_masks(permutation_rank: Array, valid: Array) -> tuple[Array, Array]:
    """XLNet: rank [b, s], valid [b, s] bool -> (content mask, query mask), each bool [b, 1, s, s] (query, key):
    the content of rank r sees the tokens of rank <= r, the query of rank r those of rank < r."""
    no_masks = jnp.zeros_like(valid)
    return (visible_keys(permutation_rank + 1, permutation_rank, no_masks, valid),
            visible_keys(permutation_rank, permutation_rank, no_masks, valid))


def masked_permutation_masks(valid: Array, num_predicted: Array, num_queries: int) -> tuple[Array, Array, Array]:
    """MPNet's streams over content slots [x (n, in permuted order), masks (b)] (module docstring).

    valid [b, N] bool: the content slots in use, n + b of them from the start of each row;
    num_predicted [b] int: b per row; num_queries: Q >= every b, the query stream's length.
    -> (content mask [b, 1, N, N], query mask [b, 1, Q, N], query slots [b, Q]: the content slot of each
    query's mask token; queries past a row's b get slot 0 and are to be ignored).
    """
    slots = jnp.arange(valid.shape[1])[None, :]
    num_real = jnp.sum(valid, axis=1, keepdims=True) - num_predicted[:, None]  # n
    unpredicted = num_real - num_predicted[:, None]  # c
    is_mask = valid & (slots >= num_real)
    steps = jnp.where(is_mask, slots - num_predicted[:, None], slots)
    content_levels = jnp.where(is_mask, unpredicted, jnp.maximum(unpredicted, steps + 1))
    query_steps = unpredicted + jnp.arange(num_queries)[None, :]  # [b, Q]
    query_slots = jnp.where(query_steps < num_real, query_steps + num_predicted[:, None], 0)
    return (visible_keys(content_levels, steps, is_mask, valid),
            visible_keys(query_steps, steps, is_mask, valid), query_slots)


class TwoStreamBlock(nn.Module):
    """A transformer layer applied to the content and the query stream with shared parameters.

    `config` gives num_heads, head_dim, d_ff, activation, the dropout rates, layer_norm_epsilon,
    attention_kernel and the dtypes. pre_layer_norm: GPT-2's block (parameters pre_attention_layer_norm,
    attention, pre_mlp_layer_norm, mlp); else the post-LN block of BERT and MPNet with `PostLNLayer`'s
    parameters (attention, attention_layer_norm, mlp, mlp_layer_norm), so a two-stream model and its
    single-stream encoder share one parameter tree. A row with no visible key (XLNet's query of the first
    token of the order) gets no attention update.
    """

    config: object
    pre_layer_norm: bool

    @nn.compact
    def __call__(
        self, content: Array, query: Array, content_bias: Array, query_bias: Array, enable_dropout: bool = False
    ) -> tuple[Array, Array]:
        """content [b, n, embed], query [b, q, embed]; additive biases [b, 1|heads, n|q, n] -> (content, query)."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate, deterministic=not enable_dropout)
        prefix = "pre_" if self.pre_layer_norm else ""
        attention_norm, mlp_norm = (
            LayerNorm(c.layer_norm_epsilon, name=f"{prefix}{name}_layer_norm", **dtype_kwargs(c))
            for name in ("attention", "mlp")
        )
        attention = MultiHeadAttention(
            c.num_heads, c.head_dim, c.attention_dropout_rate, use_bias=True, scale_logits=True,
            attention_kernel=c.attention_kernel, name="attention", **dtype_kwargs(c),
        )
        mlp = MlpBlock(c.d_ff, (c.activation,), 0.0, use_bias=True, name="mlp", **dtype_kwargs(c))
        keys = attention_norm(content) if self.pre_layer_norm else content

        def update(stream: Array, bias: Array) -> Array:
            attended = attention(attention_norm(stream) if self.pre_layer_norm else stream, keys, bias, enable_dropout)
            has_keys = jnp.any(bias > NEG_INF / 2, axis=-1)[:, 0, :, None]  # [b, q, 1]
            stream = stream + drop(jnp.where(has_keys, attended, 0))
            if not self.pre_layer_norm:
                stream = attention_norm(stream)
            residual = mlp(mlp_norm(stream) if self.pre_layer_norm else stream, enable_dropout)
            stream = stream + drop(residual)
            if not self.pre_layer_norm:
                stream = mlp_norm(stream)
            return nn.with_logical_constraint(stream, HIDDEN_AXES)

        return update(content, content_bias), update(query, query_bias)
