"""What a decode carries per row, and its row operations: repeating rows (several decodes per input)
and picking rows (beam search).

Every leaf of a key/value cache (layers.attention.MultiHeadAttention's 'cache'
collection) is [..., batch, length, heads, head_dim]: scanned layers add a
leading layer axis. A row's own inputs (encoder tokens, masks, lengths) are
[batch, ...].
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
CACHE_LEAF_RANK = 4  # [batch, length, heads, head_dim]


class DecodeState(NamedTuple):
    """kv: the key/value cache; inputs: what each row's decoding calls read besides it."""

    kv: Any
    inputs: Any


def _map_rows(state: DecodeState, op: Any) -> DecodeState:
    """op(leaf, batch_axis) on every leaf."""
    kv = jax.tree.map(lambda leaf: op(leaf, leaf.ndim - CACHE_LEAF_RANK), state.kv)
    return DecodeState(kv, jax.tree.map(lambda leaf: op(leaf, 0), state.inputs))


def repeat_rows(state: DecodeState, times: int) -> DecodeState:
    """Each row `times` times in a row: row i becomes rows i * times ... i * times + times - 1."""
    return _map_rows(state, lambda leaf, axis: jnp.repeat(leaf, times, axis=axis))


def take_rows(state: DecodeState, rows: Array) -> DecodeState:
    """The rows `rows` (int [n]), in that order."""
    return _map_rows(state, lambda leaf, axis: jnp.take(leaf, rows, axis=axis))
