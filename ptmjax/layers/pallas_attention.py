"""attention_kernel='pallas_tpu_flash': JAX's Pallas TPU flash-attention kernel
(`jax.experimental.pallas.ops.tpu.flash_attention`) behind MultiHeadAttention.

What the kernel gets. MultiHeadAttention receives every mask already folded into one additive bias
(T5's relative-position bias plus the padding, segment, causal or prefix-LM mask as NEG_INF), so
that bias is the kernel's `ab` [b, heads, q, k] and the kernel's own `segment_ids` and `causal`
are not used. That keeps every mask ptmjax builds (packing, prefix LM, padding, cross-attention,
decoding caches, prefix tuning) exact, at two costs: a bias of b * heads * q * k elements is
materialised once per attention kind (shared by the layers of a stack), and the kernel cannot skip
the blocks a causal mask removes. What it saves is the per-layer logits and probabilities
[b, heads, q, k] that the einsum path computes and, without remat, keeps for the backward pass
(`docs/aot_compile.md` measures it).

Lengths. The kernel's blocks are 128 long (its `BlockSizes.get_default`) and its backward pass
needs the key blocks to be multiples of 128, so queries and keys are padded up to a multiple of
128: padded keys get a bias of PAD_KEY_BIAS, far below NEG_INF, so a row whose real keys are all
masked still averages them as the einsum reference does; padded query rows are sliced off.

Platforms. The platform is that of the devices of the mesh in context (`jax.set_mesh`, as the
Trainer sets it, and `ptmjax compile` with a TPU topology's devices), else JAX's default backend.
On TPU the kernel is compiled by Mosaic; on CPU it runs in Pallas's TPU interpret mode
(`force_tpu_interpret_mode`), which is slow and exists for tests and for checking results on a
machine without a TPU. GPUs are refused: use 'cudnn' or 'xla' there. (`jax.lax.platform_dependent`
cannot choose instead: interpret mode's callbacks are ordered effects, and lowering the TPU branch
alone then fails with "Lowering rule for `cond` returns incorrect set of output tokens".)

Sharding. A Pallas call is opaque to XLA's partitioner, so under a mesh it runs in `jax.shard_map`
over the mesh axes that the logical rules give the batch ('activation_batch') and the heads
('activation_heads'); lengths and head_dim stay whole on every device.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash

Array = jax.Array

BLOCK = 128  # the kernel's default block sizes; lengths are padded to a multiple of it
PAD_KEY_BIAS = -1e30  # for padded keys: far below NEG_INF (-1e10), representable in float32 and bfloat16


def _padded(length: int) -> int:
    return -(-length // BLOCK) * BLOCK


def _kernel(query: Array, key: Array, value: Array, ab: Array) -> Array:
    """The Mosaic kernel on [b, h, len, d] arrays whose lengths are multiples of BLOCK."""
    (batch, heads, num_queries, head_dim), num_keys = query.shape, key.shape[2]
    blocks = tpu_flash.BlockSizes.get_default(batch, heads, num_queries, num_keys, head_dim)
    return tpu_flash.flash_attention(query, key, value, ab, sm_scale=1.0, block_sizes=blocks)


@jax.custom_vjp
def _interpreted(query: Array, key: Array, value: Array, ab: Array) -> Array:
    """`_kernel` in TPU interpret mode. The kernel's backward pass is traced when the gradient is,
    after the forward pass's `force_tpu_interpret_mode` has ended, so this VJP enters it again."""
    with pltpu.force_tpu_interpret_mode():
        return _kernel(query, key, value, ab)


def _interpreted_fwd(query: Array, key: Array, value: Array, ab: Array):
    with pltpu.force_tpu_interpret_mode():
        return jax.vjp(_kernel, query, key, value, ab)


def _interpreted_bwd(vjp, d_out: Array):
    with pltpu.force_tpu_interpret_mode():
        return vjp(d_out)


_interpreted.defvjp(_interpreted_fwd, _interpreted_bwd)


def _padded_attention(query: Array, key: Array, value: Array, ab: Array, interpret: bool) -> Array:
    """[b, h, q, d], [b, h, k, d] x2, ab [b, h, q, k] -> [b, h, q, d]: pads, runs the kernel, slices."""
    num_queries, num_keys = query.shape[2], key.shape[2]
    pad_q, pad_k = _padded(num_queries) - num_queries, _padded(num_keys) - num_keys
    if pad_q or pad_k:
        query = jnp.pad(query, ((0, 0), (0, 0), (0, pad_q), (0, 0)))
        key, value = (jnp.pad(x, ((0, 0), (0, 0), (0, pad_k), (0, 0))) for x in (key, value))
        ab = jnp.pad(ab, ((0, 0), (0, 0), (0, pad_q), (0, 0)))
        ab = jnp.pad(ab, ((0, 0), (0, 0), (0, 0), (0, pad_k)), constant_values=PAD_KEY_BIAS)
    return (_interpreted if interpret else _kernel)(query, key, value, ab)[:, :, :num_queries]


def target_platform() -> str:
    """The platform attention runs on: that of the mesh's devices (`jax.set_mesh`), else the default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else mesh.abstract_device
    return jax.default_backend() if device is None else device.platform


def tpu_flash_attention(query: Array, key: Array, value: Array, bias: Array | None) -> Array:
    """query, key, value [b, h, len, d] (logits not scaled: sm_scale 1), bias broadcastable to
    [b, h, q, k] (added to the logits) -> context [b, h, q, d] in query's dtype."""
    platform = target_platform()
    if platform not in ("cpu", "tpu"):
        raise ValueError(
            f"attention_kernel='pallas_tpu_flash' runs on TPU (and interpreted on CPU), not on {platform!r}; "
            "use attention_kernel='cudnn' or 'xla' there"
        )
    batch, heads, num_queries, _ = query.shape
    shape = (batch, heads, num_queries, key.shape[2])
    ab = jnp.zeros(shape, query.dtype) if bias is None else jnp.broadcast_to(jnp.asarray(bias, query.dtype), shape)
    attend = functools.partial(_padded_attention, interpret=platform == "cpu")
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return attend(query, key, value, ab)
    spec = jax.sharding.PartitionSpec(*nn.logical_to_mesh_axes(("activation_batch", "activation_heads")), None, None)
    sharded = jax.shard_map(attend, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec, check_vma=False)
    return sharded(query, key, value, ab)
