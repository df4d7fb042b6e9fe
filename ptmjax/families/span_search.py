"""The best answer span of extractive QA from a model's start and end logits (pure jnp, jit-friendly)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def best_span(
    start_logits: Array, end_logits: Array, max_answer_length: int, context_mask: Array | None = None
) -> tuple[Array, Array, Array]:
    """The span (start, end) maximising start_logits[start] + end_logits[end], per row.

    Args:
      start_logits, end_logits: [b, s].
      max_answer_length: the longest span in tokens (end - start < max_answer_length).
      context_mask: [b, s], 1 on the context; given, both ends must be context tokens.
    Returns:
      (start [b] int32, end [b] int32, score [b] float32), with start <= end (inclusive indices);
      a row without any allowed span gives (0, 0, -inf).
    """
    if max_answer_length < 1:
        raise ValueError(f"max_answer_length={max_answer_length}; use a positive number of tokens.")
    batch, length = start_logits.shape
    scores = start_logits.astype(jnp.float32)[:, :, None] + end_logits.astype(jnp.float32)[:, None, :]  # [b, s, s]
    starts, ends = jnp.arange(length)[:, None], jnp.arange(length)[None, :]
    allowed = jnp.broadcast_to((ends >= starts) & (ends - starts < max_answer_length), scores.shape)
    if context_mask is not None:
        context = context_mask == 1
        allowed = allowed & context[:, :, None] & context[:, None, :]
    flat = jnp.where(allowed, scores, -jnp.inf).reshape(batch, length * length)
    best = jnp.argmax(flat, axis=-1)
    score = jnp.take_along_axis(flat, best[:, None], axis=-1)[:, 0]
    found = jnp.isfinite(score)
    start = jnp.where(found, best // length, 0).astype(jnp.int32)
    end = jnp.where(found, best % length, 0).astype(jnp.int32)
    return start, end, score
