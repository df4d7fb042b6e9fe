"""Embedding tables: token ids -> vectors, and `attend` for an output layer tied to the table."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import precision
from ptmjax.layers.common import DType, target_platform

# The token and position tables' initial stddev in GPT-2 and BERT (`initializer_range`) and BART (`init_std`).
EMBED_INIT_STDDEV = 0.02

Array = jax.Array
Initializer = nn.initializers.Initializer


def lookup(table: Array, ids: Array, dtype: DType) -> Array:
    """`table[ids]` in `dtype`, gathered from the table at float32 or wider and cast after.

    The forward values are those of casting first, but the gradient's scatter-add, one add per
    occurrence of an id, then sums in float32: in bfloat16 the rows of frequent tokens lose much
    of their gradient (a relative error of 0.03 for a Zipf-distributed batch, 2e-8 this way).
    """
    wide = jnp.promote_types(table.dtype, jnp.float32)
    return jnp.take(jnp.asarray(table, wide), ids, axis=0).astype(dtype)


def small_table_lookup(table: Array, ids: Array, dtype: DType, feature_axis: int = -1) -> Array:
    """`lookup` for a small table whose few rows many ids share (T5's 32 relative-position buckets),
    with the table's columns placed at `feature_axis` of the result.

    The same forward values, but the gradient is a one-hot matmul summed in float32 instead of a
    scatter-add: on a GPU a scatter-add's atomic adds contend for those few rows, and XLA:GPU
    emits compare-and-swap loops for them that slow down by orders of magnitude under contention
    (openxla/xla#26371 for bfloat16; jax-ml/jax#38806 for float32 in jaxlib 0.10.2 to 0.11). The
    matmul is also deterministic, and in float32 reads the result's gradient in its own layout, so
    a caller that wants the columns elsewhere than last (attention's heads) pays no transpose for it.
    """
    return _small_table_lookup(table, ids, jnp.dtype(dtype), feature_axis % (ids.ndim + 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _small_table_lookup(table: Array, ids: Array, dtype: jnp.dtype, feature_axis: int) -> Array:
    return jnp.moveaxis(lookup(table, ids, dtype), -1, feature_axis)


def _small_table_lookup_forward(
    table: Array, ids: Array, dtype: jnp.dtype, feature_axis: int
) -> tuple[Array, tuple[Array, Array]]:
    return _small_table_lookup(table, ids, dtype, feature_axis), (table, ids)


def _small_table_lookup_backward(
    dtype: jnp.dtype, feature_axis: int, residuals: tuple[Array, Array], cotangent: Array
) -> tuple:
    table, ids = residuals
    one_hot = jax.nn.one_hot(ids, table.shape[0], dtype=cotangent.dtype)  # [..., rows]
    summed = tuple(range(ids.ndim))
    cotangent_summed = tuple(axis for axis in range(cotangent.ndim) if axis != feature_axis)
    if cotangent.dtype == jnp.float32:  # [features, rows]: the cotangent read in its own layout
        gradient = precision.dot_general(cotangent, one_hot, ((cotangent_summed, summed), ((), ()))).T
    else:  # XLA:CPU has no bfloat16 product with a float32 result for that layout
        gradient = precision.float32_dot_general(one_hot, cotangent, ((summed, cotangent_summed), ((), ())))
    return gradient.astype(table.dtype), None


_small_table_lookup.defvjp(_small_table_lookup_forward, _small_table_lookup_backward)


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
        """query [..., embed] -> logits [..., vocab] = query @ embedding.T (`tied_logits`)."""
        query, embedding = jnp.asarray(query, self.dtype), jnp.asarray(self.embedding, self.dtype)
        return tied_logits(query, embedding)


def tied_logits(query: Array, embedding: Array) -> Array:
    """query [..., embed] @ embedding [vocab, embed].T -> logits [..., vocab], as `precision.einsum`.

    In float32 on the CPU the table's gradient is computed as [embed, vocab] and transposed after, which
    moves the table's size; XLA:CPU otherwise transposes the logits' gradient [..., vocab] to feed its
    product, as many times larger as there are positions (GPT-2 small at 8 x 512: 0.8 GB, about 1 s of
    its 18 s step on a 2-core CPU). Other platforms' products take either layout as it is, and bfloat16
    keeps the seam's float32-accumulating products.
    """
    if target_platform() != "cpu" or jnp.result_type(query, embedding) != jnp.float32:
        return precision.einsum("...e,ve->...v", query, embedding)
    return _float32_tied_logits(query, embedding)


@jax.custom_vjp
def _float32_tied_logits(query: Array, embedding: Array) -> Array:
    return precision.einsum("...e,ve->...v", query, embedding)


def _tied_logits_forward(query: Array, embedding: Array) -> tuple[Array, tuple[Array, Array]]:
    return _float32_tied_logits(query, embedding), (query, embedding)


def _tied_logits_backward(residuals: tuple[Array, Array], cotangent: Array) -> tuple[Array, Array]:
    query, embedding = residuals
    d_query = precision.einsum("...v,ve->...e", cotangent, embedding)
    # The barrier keeps XLA from folding the transpose back into the product.
    d_embedding = jax.lax.optimization_barrier(precision.einsum("...e,...v->ev", query, cotangent))
    return d_query, d_embedding.T


_float32_tied_logits.defvjp(_tied_logits_forward, _tied_logits_backward)
