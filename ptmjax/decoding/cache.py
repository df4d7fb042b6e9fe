"""What a decode carries per row, and its row operations: repeating rows (several decodes per input)
and picking beams (beam search).

Every leaf of a key/value cache (layers.attention.MultiHeadAttention's 'cache'
collection) is [..., batch, heads, length, head_dim]: scanned layers add a
leading layer axis. A row's own inputs (encoder tokens, masks, lengths) are
[batch, ...].
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
CACHE_LEAF_RANK = 4  # [batch, heads, length, head_dim]


class DecodeState(NamedTuple):
    """kv: the key/value cache; inputs: what each row's decoding calls read besides it."""

    kv: Any
    inputs: Any


SELF_ATTENTION_LEAVES = ("cached_key", "cached_value")  # what differs between the beams of one input


def repeat_rows(state: DecodeState, times: int) -> DecodeState:
    """Each row `times` times in a row: row i becomes rows i * times ... i * times + times - 1."""
    kv = jax.tree.map(lambda leaf: jnp.repeat(leaf, times, axis=leaf.ndim - CACHE_LEAF_RANK), state.kv)
    return DecodeState(kv, jax.tree.map(lambda leaf: jnp.repeat(leaf, times, axis=0), state.inputs))


def take_beams(state: DecodeState, rows: Array) -> DecodeState:
    """The self-attention caches of rows `rows` (int [n]), in that order, where each row is one of the
    beams of the same input as the row it replaces: what those beams share (cross-attention keys
    and values, the inputs) stays as it is."""

    def take(path: tuple, leaf: Array) -> Array:
        if getattr(path[-1], "key", None) not in SELF_ATTENTION_LEAVES:
            return leaf
        return jnp.take(leaf, rows, axis=leaf.ndim - CACHE_LEAF_RANK)

    return DecodeState(jax.tree_util.tree_map_with_path(take, state.kv), state.inputs)
