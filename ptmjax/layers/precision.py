"""The precision seam: every matrix product of every family goes through `einsum`, `dot_general`, `matmul`
or `ragged_dot` here, and takes the policy of its operands.

The operands' result type, which a model config's `dtype` sets, picks the policy:

- 'plain' (float32, or float64 in tests): the product XLA gives, bit for bit `jnp.einsum`,
  `jax.lax.dot_general`, `jnp.matmul` and `jax.lax.ragged_dot`. float16 takes it too: its products as
  XLA gives them (float16 activations train with dynamic loss scaling, ptmjax/training/loss_scaling.py).
- 'bfloat16': bfloat16 operands, float32 accumulation, a bfloat16 result, forward and backward
  (ptmjax/layers/mixed_precision.py: on the CPU a float32-accumulating form; on TPUs and GPUs, whose
  bfloat16 products accumulate in float32 already, the plain product).

A new policy (int8 products with float32 accumulation, say) is one more entry of POLICIES and a rule in
`policy_of`; no layer changes. The fused kernels, which run their own products, say which policies they
take: `blockwise_attention.POLICIES`, `pallas_attention.POLICIES`, `grouped_matmul.MEGABLOX_POLICIES`
and `attention.KERNEL_POLICIES` for `jax.nn.dot_product_attention`. `tests/test_package_layout.py` keeps
every other product in the layers, models, families and adapt on this seam.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ptmjax.layers import mixed_precision
from ptmjax.layers.common import target_platform

Array = jax.Array
PLAIN, BFLOAT16 = "plain", "bfloat16"


@dataclasses.dataclass(frozen=True)
class Policy:
    """How one policy computes each kind of product."""

    name: str
    einsum: Callable[[str, Array, Array], Array]
    dot_general: Callable[[Array, Array, tuple], Array]
    ragged_dot: Callable[[Array, Array, Array], Array]


def _plain_einsum(spec: str, a: Array, b: Array) -> Array:
    return jnp.einsum(spec, a, b)


def _bfloat16_ragged_dot(rows: Array, kernels: Array, group_sizes: Array) -> Array:
    """A grouped product accumulated in float32, as the policy's other products are."""
    if target_platform() != "cpu":
        return jax.lax.ragged_dot(rows, kernels, group_sizes)
    return jax.lax.ragged_dot(rows, kernels, group_sizes, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


POLICIES = {
    PLAIN: Policy(PLAIN, _plain_einsum, jax.lax.dot_general, jax.lax.ragged_dot),
    BFLOAT16: Policy(BFLOAT16, mixed_precision.einsum, mixed_precision.dot_general, _bfloat16_ragged_dot),
}


def policy_of(a: Array, b: Array) -> Policy:
    """The policy of a product of `a` and `b`: 'bfloat16' when their result type is bfloat16, else 'plain'."""
    return POLICIES[BFLOAT16 if jnp.result_type(a, b) == jnp.bfloat16 else PLAIN]


def einsum(spec: str, a: Array, b: Array) -> Array:
    """`jnp.einsum(spec, a, b)` under the operands' policy (two operands, an explicit '->')."""
    return policy_of(a, b).einsum(spec, a, b)


def dot_general(lhs: Array, rhs: Array, dimension_numbers: tuple) -> Array:
    """`jax.lax.dot_general(lhs, rhs, dimension_numbers)` under the operands' policy."""
    return policy_of(lhs, rhs).dot_general(lhs, rhs, dimension_numbers)


def matmul(a: Array, b: Array) -> Array:
    """`a @ b` for a [..., k] and a matrix b [k, n], under the operands' policy."""
    if b.ndim != 2:
        raise ValueError(f"precision.matmul takes a matrix on the right, got shape {b.shape}; use precision.einsum")
    policy = policy_of(a, b)
    return jnp.matmul(a, b) if policy.name == PLAIN else policy.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())))


def float32_dot_general(lhs: Array, rhs: Array, dimension_numbers: tuple) -> Array:
    """`jax.lax.dot_general` with a float32 result accumulated in float32, whatever the operands: for a gradient
    that is summed into float32 parameters (the embedding's small-table lookup)."""
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, preferred_element_type=jnp.float32)


def ragged_dot(rows: Array, kernels: Array, group_sizes: Array) -> Array:
    """`jax.lax.ragged_dot(rows, kernels, group_sizes)` under the operands' policy."""
    return policy_of(rows, kernels).ragged_dot(rows, kernels, group_sizes)
