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

Sharding. A Pallas call is opaque to XLA's partitioner, so under a mesh the kernel runs in
`jax.shard_map` over the mesh axes that the logical rules give the batch ('activation_batch') and
the heads ('activation_heads'); lengths and head_dim stay whole on every device. The VJP is this
module's (`_attention`), around the kernel's forward pass (`_flash_attention` with its softmax
statistics) and backward pass (`_flash_attention_bwd`), which are private functions of the kernel
module: jax is pinned to 0.10.x (setup.py), and the tests exercise both.
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


def _blocks(query: Array, key: Array) -> tpu_flash.BlockSizes:
    (batch, heads, num_queries, head_dim), num_keys = query.shape, key.shape[2]
    return tpu_flash.BlockSizes.get_default(batch, heads, num_queries, num_keys, head_dim)


def _forward(query: Array, key: Array, value: Array, ab: Array) -> tuple[Array, Array, Array]:
    """The kernel's forward pass on [b, h, len, d] arrays whose lengths are multiples of BLOCK: the
    context and the softmax statistics l and m [b, h, q] its backward pass needs."""
    return tpu_flash._flash_attention(query, key, value, ab, None, True, False, 1.0, _blocks(query, key), False)


def _backward(query: Array, key: Array, value: Array, ab: Array, out: Array, sums: Array, maxes: Array, d_out: Array):
    """The kernel's backward pass: gradients of query, key, value and ab."""
    residuals = (query, key, value, ab, None, out, sums, maxes)
    return tpu_flash._flash_attention_bwd(False, False, 1.0, _blocks(query, key), False, residuals, d_out)[:4]


def _run(fn, how, num_outputs: int):
    """`fn` per device under `jax.shard_map` when `how` has a mesh, in TPU interpret mode when it says so."""
    interpret, mesh, spec = how

    def run(*args):
        if interpret:
            with pltpu.force_tpu_interpret_mode():
                return fn(*args)
        return fn(*args)

    if mesh is None:
        return run
    stats = jax.sharding.PartitionSpec(*spec[:3])  # l and m [b, h, q]
    in_specs = (spec,) * 5 + (stats, stats, spec) if num_outputs == 4 else (spec,) * 4
    out_specs = (spec,) * 4 if num_outputs == 4 else (spec, stats, stats)
    return jax.shard_map(run, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


# The VJP is defined here, outside `shard_map`, rather than by the kernel's own custom VJP inside it: its
# residuals are then the layer's own arrays (the bias one stack's layers share) instead of per-layer copies
# that a `shard_map` returns, and its backward pass is traced inside interpret mode when that is on.
@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(query: Array, key: Array, value: Array, ab: Array, how) -> Array:
    return _run(_forward, how, 3)(query, key, value, ab)[0]


def _attention_fwd(query: Array, key: Array, value: Array, ab: Array, how):
    out, sums, maxes = _run(_forward, how, 3)(query, key, value, ab)
    return out, (query, key, value, ab, out, sums, maxes)


def _attention_bwd(how, residuals, d_out: Array):
    return tuple(_run(_backward, how, 4)(*residuals, d_out))


_attention.defvjp(_attention_fwd, _attention_bwd)


def _padded_attention(query: Array, key: Array, value: Array, ab: Array, how) -> Array:
    """[b, h, q, d], [b, h, k, d] x2, ab [b, h, q, k] -> [b, h, q, d]: pads, runs the kernel, slices."""
    num_queries, num_keys = query.shape[2], key.shape[2]
    pad_q, pad_k = _padded(num_queries) - num_queries, _padded(num_keys) - num_keys
    if pad_q or pad_k:
        query = jnp.pad(query, ((0, 0), (0, 0), (0, pad_q), (0, 0)))
        key, value = (jnp.pad(x, ((0, 0), (0, 0), (0, pad_k), (0, 0))) for x in (key, value))
        ab = jnp.pad(ab, ((0, 0), (0, 0), (0, pad_q), (0, 0)))
        ab = jnp.pad(ab, ((0, 0), (0, 0), (0, 0), (0, pad_k)), constant_values=PAD_KEY_BIAS)
    return _attention(query, key, value, ab, how)[:, :, :num_queries]


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
    mesh = jax.sharding.get_abstract_mesh()
    spec = None
    if not mesh.empty:
        batch_and_heads = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
        spec = jax.sharding.PartitionSpec(*batch_and_heads, None, None)
    return _padded_attention(query, key, value, ab, (platform == "cpu", None if mesh.empty else mesh, spec))
