"""LongT5's transient global tokens (Guo et al. 2022, section 3.1.2): which block of `global_block_size` input
tokens each token sums into, and the sums.

A row's real tokens (mask True) form blocks of `global_block_size` by their index; a trailing block that is not
full joins the last full one (an 'orphan'); padding belongs to no block (-1). Global token g exists for a row
iff some real token is in block g, and there are length // global_block_size global slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ptmjax.layers import precision

Array = jax.Array


def global_block_ids(valid: Array, global_block_size: int) -> tuple[Array, Array]:
    """valid [b, s] bool -> (block id of each token [b, s] int32, -1 for padding;
    whether each global slot exists [b, s // global_block_size] bool)."""
    length = valid.shape[1]
    index = jnp.arange(length)
    ids = jnp.where(valid, index // global_block_size, -1)  # [b, s]
    block_ends = (index % global_block_size == global_block_size - 1) & (ids >= 0)
    last_full = jnp.sum(block_ends, axis=1, keepdims=True) - 1  # [b, 1]; -1: no full block
    ids = jnp.where(ids < last_full, ids, last_full).astype(jnp.int32)
    ids = jnp.where(valid, ids, -1)
    exists = jnp.arange(length // global_block_size)[None] <= jnp.max(ids, axis=1, keepdims=True)
    return ids, exists


def global_aggregates(x: Array, block_ids: Array, num_globals: int) -> Array:
    """x [b, s, embed], block ids [b, s] -> the sum of each block's tokens [b, num_globals, embed]."""
    members = (block_ids[:, :, None] == jnp.arange(num_globals)[None, None]).astype(x.dtype)  # [b, s, g]
    return precision.einsum("bsg,bse->bge", members, x)
