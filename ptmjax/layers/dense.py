"""The dense layer every family uses: a kernel over the trailing axes, bias-free unless asked.

Its parameters are created through `nn.with_logical_partitioning`, so `init`
returns `nn.Partitioned` boxes that carry logical axis names; the partitioner
maps those names to mesh axes. Nothing here knows about the mesh.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers import precision
from ptmjax.layers.common import DType, target_platform

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
        axis = self.contracted_axes(inputs.ndim)
        kernel = self.kernel_param(tuple(inputs.shape[a] for a in axis))
        out = dense_product(jnp.asarray(inputs, self.dtype), jnp.asarray(kernel, self.dtype), axis)
        return self.with_bias(out)

    def contracted_axes(self, ndim: int) -> tuple[int, ...]:
        """The input dims the kernel contracts (`axis`, made non-negative)."""
        return _normalize_axes(self.axis, ndim)

    def kernel_param(self, in_shape: tuple[int, ...]) -> Array:
        """The `kernel` parameter [in_shape..., features...], variance-scaled by its fan-in."""
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
        return self.param("kernel", nn.with_logical_partitioning(init, self.kernel_axes), kernel_shape,
                          self.param_dtype)

    def with_bias(self, out: Array) -> Array:
        """`out` plus the zero-initialised `bias` [features...] if `use_bias`, named by the output axes."""
        if not self.use_bias:
            return out
        bias_axes = tuple(self.kernel_axes[len(self.kernel_axes) - len(self.features):])
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, bias_axes), tuple(self.features),
            self.param_dtype,
        )
        return out + jnp.asarray(bias, self.dtype)


def dense_product(inputs: Array, kernel: Array, axis: tuple[int, ...]) -> Array:
    """`inputs` contracted over its `axis` dims with the leading dims of `kernel`, as `precision.dot_general`.

    In float32 on the CPU the kernel's gradient is a row-major product with the smaller of the inputs and
    the output's gradient transposed first: left to choose, XLA:CPU transposes the right operand of the
    product, and for an MLP's `wi` that is the hidden gradient [tokens, d_ff] rather than the input
    [tokens, embed] (T5-small's MLP forward and backward: 225 against 252 ms, docs/performance_log.md).
    """
    if target_platform() != "cpu" or jnp.result_type(inputs, kernel) != jnp.float32:
        return precision.dot_general(inputs, kernel, ((axis, tuple(range(len(axis)))), ((), ())))
    return _float32_dense_product(inputs, kernel, axis)


def _contract(inputs: Array, kernel: Array, axis: tuple[int, ...]) -> Array:
    return precision.dot_general(inputs, kernel, ((axis, tuple(range(len(axis)))), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _float32_dense_product(inputs: Array, kernel: Array, axis: tuple[int, ...]) -> Array:
    return _contract(inputs, kernel, axis)


def _dense_product_forward(inputs: Array, kernel: Array, axis: tuple[int, ...]) -> tuple[Array, tuple[Array, Array]]:
    return _contract(inputs, kernel, axis), (inputs, kernel)


def _dense_product_backward(axis: tuple[int, ...], residuals: tuple[Array, Array], cotangent: Array) -> tuple:
    inputs, kernel = residuals
    _, inputs_vjp = jax.vjp(lambda x: _contract(x, kernel, axis), inputs)
    (d_inputs,) = inputs_vjp(cotangent)
    batch = tuple(a for a in range(inputs.ndim) if a not in axis)  # the cotangent's leading dims, in order
    rows = math.prod(inputs.shape[a] for a in batch)
    inputs_2d = jnp.transpose(inputs, batch + axis).reshape(rows, -1)  # [tokens, in]
    cotangent_2d = cotangent.reshape(rows, -1)  # [tokens, out]
    # The barriers keep XLA from folding the transposes back into the product.
    if inputs_2d.size <= cotangent_2d.size:
        d_kernel = precision.matmul(jax.lax.optimization_barrier(inputs_2d.T), cotangent_2d)
    else:
        transposed = precision.matmul(jax.lax.optimization_barrier(cotangent_2d.T), inputs_2d)
        d_kernel = jax.lax.optimization_barrier(transposed).T
    return d_inputs, d_kernel.reshape(kernel.shape)


_float32_dense_product.defvjp(_dense_product_forward, _dense_product_backward)
