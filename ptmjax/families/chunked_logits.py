"""The output layer and the token loss a chunk of positions at a time, so float32 logits never exist
for the whole batch.

The final hidden states [b, t, embed] are cut along the length into chunks of `chunk_size`
positions (every row of the batch in each chunk, so the batch keeps its sharding); `jax.lax.map`
runs the output layer and `token_cross_entropy` on one chunk at a time under `jax.checkpoint`, so
the backward pass also recomputes one chunk's logits at a time instead of keeping them all.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from ptmjax.families.token_loss import argmax_hits, token_cross_entropy

Array = jax.Array


def chunked_token_cross_entropy(
    logits_fn: Callable[[Array], Array], hidden: Array, targets: Array, chunk_size: int, z_loss: float = 0.0,
    label_smoothing: float = 0.0,
) -> tuple[Array, Array, Array]:
    """`token_cross_entropy(logits_fn(hidden), targets, ...)` and the argmax hits, chunk by chunk.

    Args:
      logits_fn: hidden [b, c, embed] -> logits [b, c, vocab] (the model's output layer).
      hidden: [b, t, embed] final hidden states; targets: [b, t] ids.
      chunk_size: positions per chunk; the length is padded up to a multiple of it.
    Returns:
      (loss, z, correct), each float32 [b, t]: as `token_cross_entropy`, and 1.0 where the
      target is the argmax of its logits.
    """

    def chunk_terms(chunk_hidden: Array, chunk_targets: Array) -> tuple[Array, Array, Array]:
        logits = logits_fn(chunk_hidden)
        loss, z = token_cross_entropy(logits, chunk_targets, z_loss, label_smoothing)
        return loss, z, argmax_hits(logits, chunk_targets)

    return map_over_chunks(chunk_terms, (hidden, targets), chunk_size)


def map_over_chunks(
    fn: Callable[..., tuple[Array, ...]], arrays: tuple[Array, ...], chunk_size: int
) -> tuple[Array, ...]:
    """`fn` of the arrays' chunks of `chunk_size` positions, one chunk at a time under `jax.checkpoint`.

    Args:
      fn: arrays [b, c, ...] -> a tuple of per-position terms [b, c].
      arrays: [b, t, ...] each, padded with zeros along t up to a multiple of `chunk_size`.
    Returns:
      `fn`'s terms for the whole length, [b, t] each.
    """
    batch, length = arrays[0].shape[:2]
    chunks = -(-length // chunk_size)
    pad = chunks * chunk_size - length
    padded = [jnp.pad(x, ((0, 0), (0, pad), *((0, 0),) * (x.ndim - 2))) for x in arrays]

    def by_chunk(x: Array) -> Array:  # [b, chunks * c, ...] -> [chunks, b, c, ...]
        return jnp.swapaxes(x.reshape(batch, chunks, chunk_size, *x.shape[2:]), 0, 1)

    terms = jax.lax.map(jax.checkpoint(lambda chunk: fn(*chunk)), tuple(by_chunk(x) for x in padded))
    return tuple(jnp.swapaxes(x, 0, 1).reshape(batch, -1)[:, :length] for x in terms)
