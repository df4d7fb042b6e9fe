"""T5 multi-head attention and the packing-aware attention masks.

Masks are boolean [batch, 1, q_len, k_len] (True = may attend). Packing puts
several examples in one row, marked by segment ids 1, 2, 3, ... (0 = padding);
no attention crosses segments. `pad_token_id` (0 by default; BART uses 1) is
padding in encoder inputs; decoder inputs start with id 0 (the BOS of T5), so
decoder padding is known only from segment ids, and without them causality
alone keeps real positions clean.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType
from ptmjax.layers.dense import Dense

Array = jax.Array

NEG_INF = -1e10  # finite, so a fully masked row gives a uniform softmax instead of NaN


def pairwise_mask(query_valid: Array, key_valid: Array) -> Array:
    """query_valid [b, q], key_valid [b, k] (bool) -> [b, 1, q, k] where both are valid."""
    return (query_valid[:, :, None] & key_valid[:, None, :])[:, None]


def segment_mask(query_segment_ids: Array, key_segment_ids: Array) -> Array:
    """[b, q], [b, k] -> [b, 1, q, k]: same nonzero segment."""
    same = query_segment_ids[:, :, None] == key_segment_ids[:, None, :]
    return (same & (query_segment_ids[:, :, None] > 0))[:, None]


def causal_mask(length: int) -> Array:
    """[1, 1, length, length]: key index <= query index."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


def prefix_lm_self_mask(
    length: int, causal_attention: Array | None = None, segment_ids: Array | None = None, batch: int = 1
) -> Array:
    """Decoder-only mask [b, 1, t, t]: causal, plus bidirectional inside a prefix, within a segment.

    causal_attention [b, t] (bool/int, as seqio's `decoder_causal_attention`)
    marks the prefix: a query and a key both inside it may attend in either
    direction. All ones gives a bidirectional model, None a causal one.
    """
    mask = jnp.broadcast_to(causal_mask(length), (batch, 1, length, length))
    if causal_attention is not None:
        prefix = causal_attention.astype(bool)
        mask = mask | pairwise_mask(prefix, prefix)
    if segment_ids is not None:
        mask = mask & segment_mask(segment_ids, segment_ids)
    return mask


def encoder_self_mask(tokens: Array, segment_ids: Array | None = None, pad_token_id: int = 0) -> Array:
    """Bidirectional mask [b, 1, s, s] over tokens != pad_token_id, within a segment when packed."""
    valid = tokens != pad_token_id
    mask = pairwise_mask(valid, valid)
    if segment_ids is not None:
        mask = mask & segment_mask(segment_ids, segment_ids)
    return mask


def decoder_self_mask(tokens: Array, segment_ids: Array | None = None) -> Array:
    """Causal mask [b, 1, t, t], within a segment when packed."""
    batch, length = tokens.shape
    mask = jnp.broadcast_to(causal_mask(length), (batch, 1, length, length))
    if segment_ids is not None:
        mask = mask & segment_mask(segment_ids, segment_ids)
    return mask


def cross_mask(
    decoder_tokens: Array,
    encoder_tokens: Array,
    decoder_segment_ids: Array | None = None,
    encoder_segment_ids: Array | None = None,
    pad_token_id: int = 0,
) -> Array:
    """Decoder-to-encoder mask [b, 1, t, s]: encoder keys != pad_token_id, of the same segment."""
    if (decoder_segment_ids is None) != (encoder_segment_ids is None):
        raise ValueError(
            "cross_mask needs both decoder_segment_ids and encoder_segment_ids (packed data) or neither; got "
            f"decoder_segment_ids={'set' if decoder_segment_ids is not None else None}, "
            f"encoder_segment_ids={'set' if encoder_segment_ids is not None else None}."
        )
    query_valid = jnp.ones(decoder_tokens.shape, dtype=bool)
    mask = pairwise_mask(query_valid, encoder_tokens != pad_token_id)
    if decoder_segment_ids is not None:
        mask = mask & segment_mask(decoder_segment_ids, encoder_segment_ids)
    return mask


def mask_to_bias(mask: Array, dtype: DType = jnp.float32) -> Array:
    """Boolean mask -> additive bias: 0 where allowed, a large negative number elsewhere."""
    return jnp.where(mask, 0.0, NEG_INF).astype(dtype)


class MultiHeadAttention(nn.Module):
    """Multi-head attention; by default T5's: no biases, no 1/sqrt(head_dim) scaling (folded into the query init).

    `use_bias=True, scale_logits=True` gives BERT/GPT-2 attention: biased
    projections and logits divided by sqrt(head_dim).
    Attention probabilities are sown into 'intermediates' as `attention_weights`
    [b, heads, q, k]; apply with `mutable=['intermediates']` to read them.
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    use_bias: bool = False
    scale_logits: bool = False
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(
        self, inputs_q: Array, inputs_kv: Array, bias: Array | None = None, enable_dropout: bool = False
    ) -> Array:
        """inputs_q [b, q, embed], inputs_kv [b, k, embed], bias broadcastable to [b, heads, q, k] -> [b, q, embed]."""
        embed = inputs_q.shape[-1]
        proj = {
            "features": (self.num_heads, self.head_dim),
            "kernel_axes": ("embed", "heads", "kv"),
            "kernel_distribution": "normal",
            "use_bias": self.use_bias,
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
        }
        head_axes = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
        query_scale = 1.0 if self.scale_logits else 1.0 / self.head_dim
        query = Dense(name="query", kernel_scale=query_scale, **proj)(inputs_q)  # [b, q, h, d]
        key = Dense(name="key", **proj)(inputs_kv)  # [b, k, h, d]
        value = Dense(name="value", **proj)(inputs_kv)  # [b, k, h, d]
        query = nn.with_logical_constraint(query, head_axes)
        key = nn.with_logical_constraint(key, head_axes)
        value = nn.with_logical_constraint(value, head_axes)

        if self.scale_logits:
            query = query * jnp.asarray(self.head_dim**-0.5, query.dtype)
        logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)  # [b, h, q, k]
        if bias is not None:
            logits = logits + jnp.asarray(bias, logits.dtype)
        weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
        self.sow("intermediates", "attention_weights", weights)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=not enable_dropout)

        context = jnp.einsum("bhqk,bkhd->bqhd", weights, value)  # [b, q, h, d]
        context = nn.with_logical_constraint(context, head_axes)
        out = Dense(
            name="out",
            features=(embed,),
            axis=(-2, -1),
            kernel_axes=("heads", "kv", "embed"),
            kernel_distribution="normal",
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )(context)  # [b, q, embed]
        return nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_embed"))
