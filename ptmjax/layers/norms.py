"""Normalisation layers, statistics in float32 whatever the compute dtype.

- `LayerNorm` (BERT, GPT-2, BART): (x - mean) / sqrt(var + eps) * scale + bias.
- `RMSNorm` (T5): scale * x / sqrt(mean(x^2) + eps); no mean subtraction, no bias.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType

Array = jax.Array


class LayerNorm(nn.Module):
    """[..., embed] -> [..., embed]; `scale` (ones) and `bias` (zeros), both named ('embed',)."""

    epsilon: float = 1e-5
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (features,), self.param_dtype
        )
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (features,), self.param_dtype
        )
        x32 = jnp.asarray(x, jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = jnp.asarray((x32 - mean) * jax.lax.rsqrt(variance + self.epsilon), self.dtype)
        return y * jnp.asarray(scale, self.dtype) + jnp.asarray(bias, self.dtype)


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
