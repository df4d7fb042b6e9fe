"""The dense layer every family uses: a kernel over the trailing axes, bias-free unless asked.

Its parameters are created through `nn.with_logical_partitioning`, so `init`
returns `nn.Partitioned` boxes that carry logical axis names; the partitioner
maps those names to mesh axes. Nothing here knows about the mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import mixed_precision
from ptmjax.layers.common import DType

Array = jax.Array


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
        out = mixed_precision.dot_general(inputs, kernel, ((axis, contract_kernel), ((), ())))
        if self.use_bias:
            bias_axes = tuple(self.kernel_axes[n_in:])
            bias = self.param(
                "bias", nn.with_logical_partitioning(nn.initializers.zeros, bias_axes), tuple(self.features),
                self.param_dtype,
            )  # fmt: skip
            out = out + jnp.asarray(bias, self.dtype)
        return out
