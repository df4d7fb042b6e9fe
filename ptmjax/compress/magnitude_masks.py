"""Exact-count magnitude masks: which weights to keep so that a given number of them, the smallest, are pruned."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def sparsity_of(masks: Any) -> float:
    """The fraction of weights the masks prune."""
    leaves = jax.tree.leaves(masks)
    pruned = sum(int(jnp.sum(~m)) for m in leaves)
    return pruned / max(sum(m.size for m in leaves), 1)


def kept_masks(weights: list[jax.Array], kept: list[jax.Array], count: jax.Array) -> list[jax.Array]:
    """Masks that prune `count` of all `weights`: those already pruned (not `kept`) first, then the smallest
    magnitudes, ties going to the earlier leaf and row-major position.

    A weight's key is its magnitude's float32 bits as an int32 (ordered as the magnitudes), -1 where pruned;
    a bisection over the keys finds the smallest threshold with `count` keys at or below it, in 32 sharded
    reductions and no sort, and a cumulative count breaks the ties at the threshold."""
    keys = [jnp.where(k, jax.lax.bitcast_convert_type(jnp.abs(w).astype(jnp.float32), jnp.int32), -1)
            for w, k in zip(weights, kept, strict=True)]

    def at_most(threshold: jax.Array) -> jax.Array:
        return sum(jnp.sum(key <= threshold, dtype=jnp.int32) for key in keys)

    def halve(_, bounds):
        low, high = bounds  # at_most(low) < count <= at_most(high)
        middle = (low & high) + ((low ^ high) >> 1)  # floor((low + high) / 2) without overflow
        enough = at_most(middle) >= count
        return jnp.where(enough, low, middle), jnp.where(enough, middle, high)

    _, threshold = jax.lax.fori_loop(0, 33, halve, (jnp.int32(-2), jnp.int32(2**31 - 1)))
    ties_pruned = count - at_most(threshold - 1)
    masks, ties_before = [], jnp.int32(0)
    for key, k in zip(keys, kept, strict=True):
        tie = key == threshold
        rank = ties_before + jnp.cumsum(tie.reshape(-1), dtype=jnp.int32).reshape(tie.shape) - 1
        masks.append(k & ~((key < threshold) | (tie & (rank < ties_pruned))))
        ties_before = ties_before + jnp.sum(tie, dtype=jnp.int32)
    return masks
