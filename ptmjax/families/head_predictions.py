"""What a task head predicts per row, from its outputs: jnp functions, jitted with the model.

- sequence classification: the class id, argmax of the logits [b];
- regression: the value [b];
- token tagging: each position's tag id, argmax per token [b, s];
- span QA: the answer span's (start, end) token indices [b, 2], inclusive, from
  `span_search.best_span` over the context tokens, at most MAX_ANSWER_LENGTH long;
- a sentence encoder: the anchor's and the positive's embeddings [b, 2, d], which a retrieval
  metric compares across the split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from ptmjax.families.span_search import best_span

Array = jax.Array
MAX_ANSWER_LENGTH = 30  # tokens, as Hugging Face's question-answering examples


def class_ids(outputs: Array, batch: Mapping[str, Array]) -> Array:
    return jnp.argmax(outputs, axis=-1).astype(jnp.int32)


def values(outputs: Array, batch: Mapping[str, Array]) -> Array:
    return outputs.astype(jnp.float32)


def answer_spans(outputs: Any, batch: Mapping[str, Array]) -> Array:
    """Spans within each row's 'context_mask' (SpanQuestionAnsweringFeatureConverter gives it)."""
    start, end, _ = best_span(outputs.start_logits, outputs.end_logits, MAX_ANSWER_LENGTH, batch["context_mask"])
    return jnp.stack([start, end], axis=-1)


def embedding_pairs(outputs: Any, batch: Mapping[str, Array]) -> Array:
    """A sentence encoder's anchor and positive embeddings, float32 [b, 2, d]."""
    return jnp.stack([outputs.anchors, outputs.positives], axis=1).astype(jnp.float32)
