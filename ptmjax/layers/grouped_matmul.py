"""Grouped matmuls of expert-sorted rows (dropless MoE), with the rows split over the batch's devices.

`grouped_matmul(rows, kernels, group_sizes)` is `jax.lax.ragged_dot`: rows [M, in] sorted by group,
`group_sizes[e]` of them for group e, each multiplied by its group's kernel [E, in, out]. Left to the
SPMD partitioner, a ragged dot keeps all M rows and their products on every device (the partitioner
cannot split the ragged dimension, whose groups' boundaries are data), which under expert
parallelism is what made a dropless Switch-Base-16 step run out of memory where the capacity-based
one fits. Here, inside a mesh (`jax.set_mesh`), each device takes the contiguous M / n of the sorted
rows that the rules' 'activation_batch' axes give it, and the kernels of every group: its groups'
local sizes are the global ones clipped to its slice, and the kernels are gathered, as FSDP gathers
weights, so the products and what the backward pass keeps are split n ways. Outside a mesh, or with
nothing to split over, or rows that do not split evenly (initialisation's one token), it is the
plain ragged dot.

On TPU each device's product is `megablox_dot`, JAX's Pallas grouped-matmul kernels (megablox), instead of
`jax.lax.ragged_dot`: XLA:TPU (libtpu 0.0.42.1) computes a ragged dot's kernel gradient as a dense product
of every group with all the rows, masked (a convolution over [E, in, out]: E times that product's FLOPs),
where megablox's `tgmm` visits each group's rows only. Elsewhere (CPU, GPU) it stays the ragged dot;
the tests run megablox in Pallas's TPU interpret mode on the CPU against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.megablox import ops as megablox
from jax.sharding import PartitionSpec

from ptmjax.layers import precision
from ptmjax.layers.common import target_platform
from ptmjax.layers.precision import BFLOAT16, PLAIN

Array = jax.Array
GroupedDot = Callable[[Array, Array, Array], Array]
TILE = 128  # megablox's tile along rows, in and out; rows are padded to a multiple of it
# The precision policies (ptmjax/layers/precision.py) megablox's kernels take: their tiles accumulate in float32.
MEGABLOX_POLICIES = {PLAIN: "float32 tiles", BFLOAT16: "bfloat16 tiles accumulated in float32"}


def grouped_matmul(rows: Array, kernels: Array, group_sizes: Array, dot: GroupedDot | None = None) -> Array:
    """rows [M, in] sorted by group, kernels [E, in, out], group_sizes [E] int32 summing to M -> [M, out].

    dot: each device's grouped product, `(rows, kernels, group_sizes) -> out`; None: `megablox_dot` on
    TPU (`layers.common.target_platform`), `precision.ragged_dot` elsewhere.
    """
    if dot is None:
        dot = megablox_dot if target_platform() == "tpu" else precision.ragged_dot
    mesh = jax.sharding.get_abstract_mesh()
    row_axes = _row_mesh_axes(mesh)
    if not row_axes or rows.shape[0] % math.prod(mesh.shape[axis] for axis in row_axes):
        return dot(rows, kernels, group_sizes)
    split = PartitionSpec(row_axes)
    return jax.shard_map(
        lambda rows, kernels, sizes: dot(rows, kernels, _local_sizes(sizes, row_axes, rows.shape[0])),
        mesh=mesh, in_specs=(split, PartitionSpec(), PartitionSpec()), out_specs=split,
        check_vma=dot is not megablox_dot,  # megablox's pallas_call declares no varying mesh axes for its output
    )(rows, kernels, group_sizes)


def megablox_dot(rows: Array, kernels: Array, group_sizes: Array) -> Array:
    """`jax.lax.ragged_dot` by megablox's Pallas TPU kernels: `gmm` forward and for the rows' gradient, `tgmm`
    for the kernels'. The rows are padded with zeros to a multiple of TILE (in no group) and the padding's
    products sliced off; the result has the inputs' dtype, accumulated in float32."""
    num_rows = rows.shape[0]
    dtype = jnp.result_type(rows, kernels)
    padded = jnp.pad(rows.astype(dtype), ((0, -num_rows % TILE), (0, 0)))
    # Positional: megablox's custom VJP takes its non-differentiable arguments by position.
    out = megablox.gmm(padded, kernels.astype(dtype), group_sizes, dtype, (TILE, TILE, TILE))
    return out[:num_rows]


def _row_mesh_axes(mesh: jax.sharding.AbstractMesh) -> tuple[str, ...]:
    """The mesh axes (of more than one device) that the rules give 'activation_batch'; () outside a mesh."""
    if mesh.empty:
        return ()
    spec = nn.logical_to_mesh_axes(("activation_batch",))
    axes = spec[0] if spec is not None else None
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return tuple(axis for axis in axes if mesh.shape[axis] > 1)


def _local_sizes(group_sizes: Array, row_axes: tuple[str, ...], local_rows: int) -> Array:
    """Each group's rows within this device's slice [i * local_rows, (i + 1) * local_rows) of the sorted rows."""
    start = jax.lax.axis_index(row_axes) * local_rows
    ends = jnp.cumsum(group_sizes)
    overlap = jnp.minimum(ends, start + local_rows) - jnp.maximum(ends - group_sizes, start)
    return jnp.maximum(overlap, 0).astype(group_sizes.dtype)
