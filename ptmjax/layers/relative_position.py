"""T5 relative position bias: log-spaced buckets of key_pos - query_pos, one scalar per head."""

from __future__ import annotations

import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType
from ptmjax.layers.embed import small_table_lookup

Array = jax.Array


def relative_position_bucket(
    relative_position: Array, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> Array:
    """Map relative positions (key_pos - query_pos) to bucket ids in [0, num_buckets).

    Bidirectional (encoder): half of the buckets for keys before the query, half
    for keys after. Causal (decoder): keys after the query all fall in bucket 0.
    Within each half, the first half of the buckets are exact distances and the
    rest are log-spaced up to `max_distance`; farther distances share the last
    bucket. Matches Mesh TensorFlow / Hugging Face T5.
    """
    relative_position = jnp.asarray(relative_position, jnp.int32)
    bucket = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = -jnp.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # Same float32 operation order as the reference so boundary cases round identically.
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
    large = max_exact + (log_ratio / math.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(is_small, distance, large)


@flax.struct.dataclass
class PositionBias:
    """T5's bias of a table [buckets, heads] at the pairs of query and key positions, computed where it is
    needed: whole (`dense`), or per (query block, key block) by context-parallel attention
    (ptmjax/layers/context_parallel.py), which never builds the [b, heads, q, k] tensor.

    query_positions [b|1, q], key_positions [b|1, k]: the positions the whole bias is of.
    """

    table: Array
    query_positions: Array
    key_positions: Array
    num_buckets: int = flax.struct.field(pytree_node=False)
    max_distance: int = flax.struct.field(pytree_node=False)
    bidirectional: bool = flax.struct.field(pytree_node=False)
    dtype: DType = flax.struct.field(pytree_node=False, default=jnp.float32)

    def block(self, query_positions: Array, key_positions: Array) -> Array:
        """query_positions [b|1, q], key_positions [b|1, k] -> bias [b|1, heads, q, k]."""
        relative = key_positions[:, None, :] - query_positions[:, :, None]  # [b, q, k]
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return small_table_lookup(self.table, buckets, self.dtype, feature_axis=1)

    def dense(self) -> Array:
        """The whole bias [b|1, heads, q, k]."""
        return self.block(self.query_positions, self.key_positions)


class RelativePositionBias(nn.Module):
    """Learned bias table [buckets, heads] -> attention bias [batch|1, heads, q_len, k_len]."""

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, query_positions: Array, key_positions: Array, structured: bool = False) -> Array | PositionBias:
        """query_positions [b, q] and key_positions [b, k] (b may be 1) -> bias [b, heads, q, k], or with
        `structured` the `PositionBias` that computes it."""
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(
                nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), ("relpos_buckets", "heads")
            ),
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )
        bias = PositionBias(table, query_positions, key_positions, self.num_buckets, self.max_distance,
                            self.bidirectional, self.dtype)
        return bias if structured else bias.dense()
