"""Basic building blocks: a dense layer (bias-free unless asked), embedding tables, RMS norm.

Every parameter is created through `nn.with_logical_partitioning`, so `init`
returns `nn.Partitioned` boxes that carry logical axis names; the partitioner
maps those names to mesh axes. Nothing here knows about the mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
Initializer = nn.initializers.Initializer
DType = jnp.dtype | type


def _normalize_axes(axes: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    return tuple(a % ndim for a in axes)


class Dense(nn.Module):
    """Dense layer contracting the trailing `axis` dims of the input; bias-free unless `use_bias`.

    Kernel shape is `input.shape[axis] + features`; `kernel_axes` names every
    kernel dimension (e.g. ('embed', 'heads', 'kv') for a query projection).
    The variance-scaling fan-in is the product of the contracted dims.
    `use_bias=True` (BERT, GPT-2) adds a zero-initialised `bias` of shape
    `features`, named by the output part of `kernel_axes`.
    """

    features: tuple[int, ...]
    kernel_axes: tuple[str, ...]
    axis: tuple[int, ...] = (-1,)
    kernel_scale: float = 1.0
    kernel_distribution: str = "truncated_normal"
    use_bias: bool = False
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, inputs: Array) -> Array:
        axis = _normalize_axes(self.axis, inputs.ndim)
        in_shape = tuple(inputs.shape[a] for a in axis)
        kernel_shape = in_shape + tuple(self.features)
        if len(self.kernel_axes) != len(kernel_shape):
            raise ValueError(
                f"Dense '{self.name}': kernel_axes {self.kernel_axes} has {len(self.kernel_axes)} names but the "
                f"kernel shape {kernel_shape} has {len(kernel_shape)} dims; give one logical name per dim."
            )
        n_in, n_out = len(in_shape), len(self.features)
        init = nn.initializers.variance_scaling(
            self.kernel_scale,
            "fan_in",
            self.kernel_distribution,
            in_axis=tuple(range(n_in)),
            out_axis=tuple(range(n_in, n_in + n_out)),
        )
        kernel = self.param(
            "kernel", nn.with_logical_partitioning(init, self.kernel_axes), kernel_shape, self.param_dtype
        )
        kernel = jnp.asarray(kernel, self.dtype)
        inputs = jnp.asarray(inputs, self.dtype)
        contract_kernel = tuple(range(n_in))
        out = jax.lax.dot_general(inputs, kernel, ((axis, contract_kernel), ((), ())))
        if self.use_bias:
            bias_axes = tuple(self.kernel_axes[n_in:])
            bias = self.param(
                "bias", nn.with_logical_partitioning(nn.initializers.zeros, bias_axes), tuple(self.features),
                self.param_dtype,
            )  # fmt: skip
            out = out + jnp.asarray(bias, self.dtype)
        return out


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
        return jnp.einsum("...e,ve->...v", jnp.asarray(query, self.dtype), jnp.asarray(self.embedding, self.dtype))


class RMSNorm(nn.Module):
    """T5 layer norm: scale * x / sqrt(mean(x^2) + eps); no mean subtraction, no bias.

    The statistics are computed in float32 whatever the compute dtype.
    """

    epsilon: float = 1e-6
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (features,), self.param_dtype
        )
        x32 = jnp.asarray(x, jnp.float32)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = jnp.asarray(x32 * jax.lax.rsqrt(variance + self.epsilon), self.dtype)
        return y * jnp.asarray(scale, self.dtype)
