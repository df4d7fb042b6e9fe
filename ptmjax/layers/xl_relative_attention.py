"""Transformer-XL's relative multi-head attention (Dai et al., 2019, section 3.3).

A segment's queries attend over its keys preceded by a memory of earlier hidden states, [memory; segment]
(k = m + t positions). With the query at position m + i and the key at j, the logit of each head is

    (q_i + u)^T k_j  +  (q_i + v)^T W_R R_{m+i-j}

scaled by 1/sqrt(head_dim): content (a), global content bias (c), position (b) and global position bias
(d) of the paper, with R the sinusoid embedding of the distance (sin then cos, as the original code),
W_R a projection per head, and u, v learned [heads, head_dim] biases. The position term is computed for
every distance k-1, ..., 0 once per query, [b, h, t, k], and moved into key order by the relative shift
(`relative_shift`), the original code's pad-and-reshape. Distances past the diagonal (future keys) come
out of the shift as other rows' entries: the caller's mask removes them.

Decoding (`cache` given, apply with mutable=['cache']) keeps each row's `RecentKeys.slots` most recent keys and
values in the 'cache' collection ([b, heads, slots, head_dim], oldest first): a call attends the cached ones
followed by its own (the first call, which creates the cache, only its own), then keeps the `slots` that end
where `RecentKeys.ends` says. Kept contiguous, the keys' distances stay those of their columns.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers import precision
from ptmjax.layers.attention import HEAD_AXES, KV_AXES
from ptmjax.layers.common import HIDDEN_AXES, DType
from ptmjax.layers.dense import Dense
from ptmjax.layers.softmax import softmax

Array = jax.Array
BIAS_INIT_STDDEV = 0.02  # u and v, as the original TF code's initializer


def sinusoid_embeddings(distances: Array, features: int) -> Array:
    """distances [k] -> [k, features]: sin(d / 10000^(2i/features)) then cos, as Transformer-XL's R."""
    inverse_frequencies = 1.0 / (10000.0 ** (jnp.arange(0, features, 2, dtype=jnp.float32) / features))
    angles = distances.astype(jnp.float32)[:, None] * inverse_frequencies[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def relative_shift(by_distance: Array) -> Array:
    """[..., t, k] with column r the distance k-1-r -> [..., t, k] with column j the distance (k-t) + i - j.

    The original's shift: a zero column before the first, the [t, k+1] rows read as [k+1, t], the first of
    those dropped, the rest read back as [t, k]. Entries of future keys (j > k-t+i) are not meaningful."""
    *lead, t, k = by_distance.shape
    padded = jnp.concatenate([jnp.zeros((*lead, t, 1), by_distance.dtype), by_distance], axis=-1)
    return padded.reshape(*lead, k + 1, t)[..., 1:, :].reshape(*lead, t, k)


@flax.struct.dataclass
class RecentKeys:
    """What a decoding call keeps in its cache: per row the `slots` (static) keys and values of the columns
    before `ends` (int32 [b]) of those it attended (the cached ones, then its own; before column 0: zeros)."""

    ends: Array
    slots: int = flax.struct.field(pytree_node=False)

    def window(self, columns: Array) -> Array:
        """columns [b, h, k, d] -> [b, h, slots, d]: each row's `slots` columns before its end."""
        padded = jnp.pad(columns, ((0, 0), (0, 0), (self.slots, 0), (0, 0)))
        return jax.vmap(lambda row, end: jax.lax.dynamic_slice_in_dim(row, end, self.slots, axis=1))(padded, self.ends)


class RelativeMultiHeadAttention(nn.Module):
    """Transformer-XL attention [b, t, embed] over [b, m + t, embed] -> [b, t, embed] (see the module doc).

    `queries` are the segment's (normed) states, `keys_values` the memory's and the segment's, the segment
    last; `bias` an additive mask broadcastable to [b, heads, t, m + t] that removes future keys (and any
    memory slot not filled); decoding (`cache`): to [b, heads, t, cached + m + t]. Projections are bias-free,
    as the original's. Probabilities are sown into 'intermediates' as `attention_weights`.
    """

    num_heads: int
    head_dim: int
    dropout_rate: float = 0.0
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(
        self, queries: Array, keys_values: Array, bias: Array, enable_dropout: bool = False,
        cache: RecentKeys | None = None,
    ) -> Array:
        embed = queries.shape[-1]
        proj = {"features": (self.num_heads, self.head_dim), "kernel_axes": ("embed", "heads", "kv"),
                "kernel_distribution": "normal", "dtype": self.dtype, "param_dtype": self.param_dtype}
        query = nn.with_logical_constraint(Dense(name="query", **proj)(queries), HEAD_AXES)  # [b, t, h, d]
        key = nn.with_logical_constraint(Dense(name="key", **proj)(keys_values), HEAD_AXES)  # [b, k, h, d]
        value = nn.with_logical_constraint(Dense(name="value", **proj)(keys_values), HEAD_AXES)
        key, value = (jnp.swapaxes(x, 1, 2) for x in (key, value))  # [b, h, k, d]
        if cache is not None:
            key, value = self._cached(key, value, cache)
        k = key.shape[2]
        distances = jnp.arange(k - 1, -1, -1)
        position = Dense(name="position", **proj)(sinusoid_embeddings(distances, embed).astype(self.dtype))
        init = nn.with_logical_partitioning(nn.initializers.normal(BIAS_INIT_STDDEV), ("heads", "kv"))
        shape = (self.num_heads, self.head_dim)
        content_bias = jnp.asarray(self.param("content_bias", init, shape, self.param_dtype), self.dtype)
        position_bias = jnp.asarray(self.param("position_bias", init, shape, self.param_dtype), self.dtype)
        content = precision.einsum("bqhd,bhkd->bhqk", query + content_bias, key)
        by_distance = precision.einsum("bqhd,khd->bhqk", query + position_bias, position)
        logits = (content + relative_shift(by_distance)) * jnp.asarray(self.head_dim**-0.5, self.dtype)
        logits = logits + jnp.asarray(bias, logits.dtype)
        weights = softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
        self.sow("intermediates", "attention_weights", weights)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=not enable_dropout)
        context = nn.with_logical_constraint(precision.einsum("bhqk,bhkd->bqhd", weights, value), HEAD_AXES)
        out = Dense(name="out", features=(embed,), axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                    kernel_distribution="normal", dtype=self.dtype, param_dtype=self.param_dtype)(context)
        return nn.with_logical_constraint(out, HIDDEN_AXES)

    def _cached(self, key: Array, value: Array, cache: RecentKeys) -> tuple[Array, Array]:
        """The call's keys and values [b, h, t', d] after the cached ones (none on the creating call); keeps
        their recent window in the cache."""
        attended = []
        for name, new in (("cached_key", key), ("cached_value", value)):
            created = self.has_variable("cache", name)
            variable = self.variable("cache", name, jnp.zeros, new.shape[:2] + (cache.slots,) + new.shape[3:],
                                     new.dtype)
            columns = jnp.concatenate([variable.value, new], axis=2) if created else new
            variable.value = nn.with_logical_constraint(cache.window(columns), KV_AXES)
            attended.append(columns)
        return attended[0], attended[1]
