"""Normalisation layers, statistics in float32 whatever the compute dtype.

- `LayerNorm` (BERT, GPT-2, BART): (x - mean) / sqrt(var + eps) * scale + bias.
- `RMSNorm` (T5): scale * x / sqrt(mean(x^2) + eps); no mean subtraction, no bias.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType

Array = jax.Array


class RMSNorm(nn.Module):
    """T5 layer norm, [..., embed] -> [..., embed]: scale * x / sqrt(mean(x^2) + eps); no mean, no bias."""

    epsilon: float = 1e-6
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32
    center: ClassVar[bool] = False  # subtract the mean and add a bias (LayerNorm)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        features = x.shape[-1]
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (features,), self.param_dtype
        )
        x32 = jnp.asarray(x, jnp.float32)
        if self.center:
            x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        y = jnp.asarray(x32 * jax.lax.rsqrt(variance + self.epsilon), self.dtype) * jnp.asarray(scale, self.dtype)
        if not self.center:
            return y
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (features,), self.param_dtype
        )
        return y + jnp.asarray(bias, self.dtype)


class LayerNorm(RMSNorm):
    """[..., embed] -> [..., embed]: (x - mean) / sqrt(var + eps) * scale + bias (BERT, GPT-2, BART)."""

    epsilon: float = 1e-5
    center: ClassVar[bool] = True
