"""bfloat16 matmuls with float32 accumulation, forward and backward, on XLA:CPU.

`einsum(spec, a, b)` and `dot_general(lhs, rhs, dimension_numbers)` are `jnp.einsum` and
`jax.lax.dot_general` themselves unless the operands' result type is bfloat16 and the layers compile
for the CPU (`common.target_platform`): float32 stays bit-identical, and TPUs and GPUs, whose bf16
matmuls accumulate in float32 already, get the plain dots that their compilers and the SPMD
partitioner know best (an AOT-compiled bf16 T5-base step, batch 8 x 512/128, on v5e:2x2 with 2-way
tensor parallelism: 2.45 GiB per device without the CPU form below against 2.62 with it, XLA FLOPs
1.02x the model's against 1.10x). On the CPU each product takes bf16 operands, accumulates in float32
(`preferred_element_type`) and casts the result back: XLA:CPU runs bf16 x bf16 -> bf16 dots at
float32 speed, and bf16 x bf16 -> f32 ones about twice as fast where the CPU has AVX512-BF16. A
`jax.custom_vjp` keeps the backward pass the same: both cotangents are such dots of the bf16
cotangent with the other operand. (Plain autodiff of a float32-output dot would give float32 x bf16
dots, which XLA:CPU runs in float32.) The dots sit inside the custom_vjp, out of a remat policy's
sight: results without batch dimensions are named NO_BATCH_DOT for the layer stacks'
'save_dot_products'.
"""

from __future__ import annotations

import functools
import math
import string

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptmjax.layers.common import target_platform

Array = jax.Array
NO_BATCH_DOT = "mixed_precision_dot_without_batch_dims"


def einsum(spec: str, a: Array, b: Array) -> Array:
    """`jnp.einsum(spec, a, b)`, accumulated in float32 when the operands' result type is bfloat16 (CPU).

    `spec` needs '->'; '...' stands for the same dims in every operand that has it. Specs whose
    backward is not two einsums (an index summed within one operand, repeated indices) are refused.
    """
    if not _accumulates(a, b):
        return jnp.einsum(spec, a, b)
    specs = _vjp_specs(spec, a.shape, b.shape)
    out = _accumulated_einsum(specs, a, b)
    a_idx, b_idx, out_idx = specs[0].replace("->", ",").split(",")
    return out if set(a_idx) & set(b_idx) & set(out_idx) else checkpoint_name(out, NO_BATCH_DOT)


def dot_general(lhs: Array, rhs: Array, dimension_numbers: tuple) -> Array:
    """`jax.lax.dot_general(lhs, rhs, dimension_numbers)`, accumulated as `einsum` says."""
    if not _accumulates(lhs, rhs):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers)
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    letters = iter(string.ascii_letters)
    lhs_idx = [next(letters) for _ in range(lhs.ndim)]
    rhs_idx = [None] * rhs.ndim
    for lhs_dim, rhs_dim in zip((*lhs_contract, *lhs_batch), (*rhs_contract, *rhs_batch), strict=True):
        rhs_idx[rhs_dim] = lhs_idx[lhs_dim]
    rhs_idx = [index or next(letters) for index in rhs_idx]
    out = [lhs_idx[d] for d in lhs_batch]
    out += [index for d, index in enumerate(lhs_idx) if d not in (*lhs_contract, *lhs_batch)]
    out += [index for d, index in enumerate(rhs_idx) if d not in (*rhs_contract, *rhs_batch)]
    return einsum(f"{''.join(lhs_idx)},{''.join(rhs_idx)}->{''.join(out)}", lhs, rhs)


def _accumulates(a: Array, b: Array) -> bool:
    """Whether the product of `a` and `b` takes the float32-accumulating CPU form: bf16 on the CPU."""
    return jnp.result_type(a, b) == jnp.bfloat16 and target_platform() == "cpu"


def _vjp_specs(spec: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[str, str, str]:
    """The specs (a, b -> out), (out, b -> a) and (a, out -> b), '...' spelt out; ValueError if unsupported."""

    def refuse(why: str) -> ValueError:
        return ValueError(f"mixed_precision.einsum cannot take spec {spec!r} for shapes {a_shape}, {b_shape}: {why}")

    if spec.count("->") != 1 or spec.split("->")[0].count(",") != 1:
        raise refuse("it needs two operands and an explicit '->'")
    ins, out = spec.replace(" ", "").split("->")
    terms = [*ins.split(","), out]
    if not all(set(t.replace("...", "", 1)) <= set(string.ascii_letters) for t in terms):
        raise refuse("indices must be letters, '...' at most once per term")
    shapes = (a_shape, b_shape)
    ellipsis_dims = {len(shape) - len(term) + 3 for term, shape in zip(terms, shapes, strict=False) if "..." in term}
    if len(ellipsis_dims) > 1 or min(ellipsis_dims, default=0) < 0 or ("..." in out) != bool(ellipsis_dims):
        raise refuse("'...' must stand for as many dims in both operands and appear in the output")
    free = [c for c in string.ascii_letters if c not in spec]
    terms = [term.replace("...", "".join(free[: min(ellipsis_dims, default=0)])) for term in terms]
    a, b, out = terms
    if any(len(set(term)) != len(term) for term in terms):
        raise refuse("an index repeats within a term")
    if not set(a) <= set(b) | set(out) or not set(b) <= set(a) | set(out) or not set(out) <= set(a) | set(b):
        raise refuse("every index must appear in two of the three terms")
    if (len(a), len(b)) != (len(a_shape), len(b_shape)):
        raise refuse("the operands' ranks do not match their terms")
    sizes = dict(zip(a, a_shape, strict=True))
    if any(sizes.setdefault(index, size) != size for index, size in zip(b, b_shape, strict=True)):
        raise refuse("an index has two sizes (broadcasting is not supported)")
    return f"{a},{b}->{out}", f"{out},{b}->{a}", f"{a},{out}->{b}"


def _dot(spec: str, x: Array, y: Array, dtype: jnp.dtype) -> Array:
    """x, y -> out as one [batch, m, k] x [batch, k, n] dot with float32 accumulation, cast to `dtype`.

    Spelt out because XLA:CPU has no fallback for a bf16 x bf16 -> f32 dot that its bf16 kernels
    (YNNPACK) do not take: e.g. 'bhqk,bqhd->bhkd' on its own fails with "Unsupported element type
    for DotThunk::Execute: BF16 x BF16 = F32".
    """
    ins, out = spec.split("->")
    xs, ys = ins.split(",")
    batch = [i for i in out if i in xs and i in ys]
    free_x, free_y = [i for i in out if i in xs and i not in ys], [i for i in out if i in ys and i not in xs]
    contract = [i for i in xs if i not in out]
    size = dict(zip(xs, x.shape, strict=True)) | dict(zip(ys, y.shape, strict=True))

    def matrices(operand: Array, indices: str, *groups: list[str]) -> Array:
        order = [indices.index(i) for group in groups for i in group]
        return jnp.transpose(operand, order).reshape([math.prod(size[i] for i in group) for group in groups])

    product = jax.lax.dot_general(
        matrices(x, xs, batch, free_x, contract), matrices(y, ys, batch, contract, free_y),
        (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32,
    )
    product = product.astype(dtype).reshape([size[i] for i in batch + free_x + free_y])
    return jnp.transpose(product, [(batch + free_x + free_y).index(i) for i in out])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _accumulated_einsum(specs: tuple[str, str, str], a: Array, b: Array) -> Array:
    return _dot(specs[0], a, b, jnp.result_type(a, b))


def _forward(specs: tuple[str, str, str], a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
    return _accumulated_einsum(specs, a, b), (a, b)


def _backward(specs: tuple[str, str, str], residuals: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    a, b = residuals
    return _dot(specs[1], g, b, a.dtype), _dot(specs[2], a, g, b.dtype)


_accumulated_einsum.defvjp(_forward, _backward)
