"""Embedding tables: token ids -> vectors, and `attend` for an output layer tied to the table."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import mixed_precision
from ptmjax.layers.common import DType

Array = jax.Array
Initializer = nn.initializers.Initializer


def lookup(table: Array, ids: Array, dtype: DType) -> Array:
    """`table[ids]` in `dtype`, gathered from the table at float32 or wider and cast after.

    The forward values are those of casting first, but the gradient's scatter-add, one add per
    occurrence of an id, then sums in float32: in bfloat16 a frequent token's row, or a T5
    relative-position bucket that 88,831 of a 512-token sequence's query-key pairs share, loses
    much of its gradient (a relative error of 0.29 for that table in bfloat16, 3e-7 this way).
    """
    wide = jnp.promote_types(table.dtype, jnp.float32)
    return jnp.take(jnp.asarray(table, wide), ids, axis=0).astype(dtype)


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
        return lookup(self.embedding, tokens, self.dtype)

    def attend(self, query: Array) -> Array:
        """query [..., embed] -> logits [..., vocab] = query @ embedding.T."""
        query, embedding = jnp.asarray(query, self.dtype), jnp.asarray(self.embedding, self.dtype)
        return mixed_precision.einsum("...e,ve->...v", query, embedding)
