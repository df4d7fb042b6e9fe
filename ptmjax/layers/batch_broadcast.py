"""Broadcasting a tensor shared by every example over the batch (T5's relative-position bias, learned
positions).

Its gradient sums the batch's cotangents. On one CPU device that sum is
written as pairwise adds of halves of the batch, which XLA fuses into one
elementwise loop: XLA:CPU's reduction over a short leading dimension of a
large array (8 x [8, 512, 512], T5-small's bias gradient) ran at about 4 GB/s,
the adds at about 26 GB/s, 100 ms against 15 ms per step (docs/performance_log.md).
On a mesh of several devices the sum stays XLA's reduction: the SPMD
partitioner (jaxlib 0.10.2) got the halves of a batch sharded four ways wrong
(GPT-2's position gradient on a data=2, fsdp=2, tensor=2 CPU mesh).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ptmjax.layers.common import target_platform

Array = jax.Array


def broadcast_batch(x: Array, batch: int) -> Array:
    """x [1, ...] -> [batch, ...]; an x whose batch is not 1 as it is."""
    if x.shape[0] != 1 or batch == 1:
        return x
    if target_platform() != "cpu" or jax.sharding.get_abstract_mesh().size > 1:
        return jnp.broadcast_to(x, (batch,) + x.shape[1:])
    return _broadcast_batch(x, batch)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _broadcast_batch(x: Array, batch: int) -> Array:
    return jnp.broadcast_to(x, (batch,) + x.shape[1:])


def _broadcast_batch_forward(x: Array, batch: int) -> tuple[Array, None]:
    return _broadcast_batch(x, batch), None


def _broadcast_batch_backward(batch: int, residuals: None, cotangent: Array) -> tuple[Array]:
    del batch, residuals
    return (sum_by_halves(cotangent),)


_broadcast_batch.defvjp(_broadcast_batch_forward, _broadcast_batch_backward)


def sum_by_halves(x: Array) -> Array:
    """x [n, ...] summed over its first axis by adding halves, kept as [1, ...]."""
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        summed = x[:half] + x[half : 2 * half]
        x = jnp.concatenate([summed, x[2 * half :]]) if x.shape[0] % 2 else summed
    return x
