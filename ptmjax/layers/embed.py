"""Embedding tables: token ids -> vectors, and `attend` for an output layer tied to the table."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import mixed_precision
from ptmjax.layers.common import DType

Array = jax.Array
Initializer = nn.initializers.Initializer


class Embed(nn.Module):
    """Embedding table [vocab, embed]; `attend` gives logits against it (tied output).

    `axes` names the table's dims: ('vocab', 'embed') for tokens, e.g.
    ('position', 'embed') for a learned position table.
    """

    num_embeddings: int
    features: int
    axes: tuple[str, str] = ("vocab", "embed")
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(self.embedding_init, tuple(self.axes)),
            (self.num_embeddings, self.features),
            self.param_dtype,
        )

    def __call__(self, tokens: Array) -> Array:
        """tokens [...] int -> embeddings [..., embed]."""
        if not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise TypeError(f"Embed expects integer token ids, got dtype {tokens.dtype}; cast with .astype(jnp.int32).")
        return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

    def attend(self, query: Array) -> Array:
        """query [..., embed] -> logits [..., vocab] = query @ embedding.T."""
        query, embedding = jnp.asarray(query, self.dtype), jnp.asarray(self.embedding, self.dtype)
        return mixed_precision.einsum("...e,ve->...v", query, embedding)
