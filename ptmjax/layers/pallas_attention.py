"""attention_kernel='pallas_tpu_flash': JAX's Pallas TPU flash-attention kernel
(`jax.experimental.pallas.ops.tpu.flash_attention`) behind MultiHeadAttention.

What the kernel gets. MultiHeadAttention hands over its `AttentionMask`
(ptmjax/layers/attention_mask.py) as the kernel's own arguments: the segment ids as its
`segment_ids`, the causal flag as `causal` (the kernel then skips the blocks above the diagonal),
and the bias, where there is one, as `ab` [b, heads, q, k]: T5's relative-position bias, or the
folded bias of a mask with no structured form (prefix LM, decoding caches, prefix tuning). GPT-2,
BART and the BERT family train with no `ab` at all. The kernel attends where the query's and the
key's ids are equal, padding (0) to padding included, where ptmjax's masks let a padding query
attend nothing: outputs at padding positions differ from the other kernels', those at real
positions (and so every loss and its gradients) do not. What it saves is the per-layer logits and
probabilities [b, heads, q, k] that the einsum path computes and, without remat, keeps for the
backward pass (`docs/aot_compile.md` measures it), and the materialised bias where there is none.

Lengths. The kernel's blocks are 128 long (its `BlockSizes.get_default`) and its backward pass
needs the key blocks to be multiples of 128, so queries and keys are padded up to a multiple of
128, with segment id PAD_SEGMENT, which no real position has (a mask without segment ids gets id 1
on its real positions): no real query sees a padded key, so a row whose real keys the bias masks
still averages them as the einsum reference does; padded query rows are sliced off.

Platforms. The platform is that of the devices of the mesh in context (`jax.set_mesh`, as the
Trainer sets it, and `ptmjax compile` with a TPU topology's devices), else JAX's default backend.
On TPU the kernel is compiled by Mosaic; on CPU it runs in Pallas's TPU interpret mode
(`force_tpu_interpret_mode`), which is slow and exists for tests and for checking results on a
machine without a TPU. GPUs are refused: use 'cudnn' or 'xla' there. (`jax.lax.platform_dependent`
cannot choose instead: interpret mode's callbacks are ordered effects, and lowering the TPU branch
alone then fails with "Lowering rule for `cond` returns incorrect set of output tokens".)

Sharding. A Pallas call is opaque to XLA's partitioner, so under a mesh the kernel runs in
`jax.shard_map` over the mesh axes that the logical rules give the batch ('activation_batch') and
the heads ('activation_heads'); segment ids are split over the batch axes only, lengths and
head_dim stay whole on every device. The VJP is this module's (`_attention`), around the kernel's
forward pass (`_flash_attention` with its softmax statistics) and backward pass
(`_flash_attention_bwd`), which are private functions of the kernel module: jax is pinned to
0.10.x (setup.py), and the tests exercise both.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash

from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.common import target_platform
from ptmjax.layers.precision import BFLOAT16, PLAIN

Array = jax.Array
SegmentIds = tpu_flash.SegmentIds

BLOCK = 128  # the kernel's default block sizes; lengths are padded to a multiple of it
PAD_SEGMENT = -1  # the segment id of the positions padded up to a block: real ones are >= 0 (0: padding)
# The precision policies (ptmjax/layers/precision.py) it takes: its blocks' products accumulate in float32.
POLICIES = {PLAIN: "float32 blocks", BFLOAT16: "bfloat16 blocks accumulated in float32"}


def _blocks(query: Array, key: Array) -> tpu_flash.BlockSizes:
    (batch, heads, num_queries, head_dim), num_keys = query.shape, key.shape[2]
    return tpu_flash.BlockSizes.get_default(batch, heads, num_queries, num_keys, head_dim)


def _forward(causal: bool, query: Array, key: Array, value: Array, ab: Array | None, segment_ids: SegmentIds | None):
    """The kernel's forward pass on [b, h, len, d] arrays whose lengths are multiples of BLOCK: the
    context and the softmax statistics l and m [b, h, q] its backward pass needs."""
    blocks = _blocks(query, key)
    return tpu_flash._flash_attention(query, key, value, ab, segment_ids, True, causal, 1.0, blocks, False)


def _backward(
    causal: bool, query: Array, key: Array, value: Array, ab: Array | None, segment_ids: SegmentIds | None,
    out: Array, sums: Array, maxes: Array, d_out: Array,
):
    """The kernel's backward pass: gradients of query, key, value and ab (None without ab)."""
    residuals = (query, key, value, ab, segment_ids, out, sums, maxes)
    return tpu_flash._flash_attention_bwd(False, causal, 1.0, _blocks(query, key), False, residuals, d_out)[:4]


def _run(fn, how):
    """`fn` per device under `jax.shard_map` when `how` has a mesh, in TPU interpret mode when it says so."""
    interpret, mesh, axes = how

    def run(*args):
        if interpret:
            with pltpu.force_tpu_interpret_mode():
                return fn(*args)
        return fn(*args)

    if mesh is None:
        return run
    batch_and_heads, batch = jax.sharding.PartitionSpec(*axes), jax.sharding.PartitionSpec(axes[0])

    def sharded(*args):  # [b, h, ...] arrays split by batch and heads, segment ids [b, len] by batch
        in_specs = jax.tree.map(lambda x: batch_and_heads if x.ndim > 2 else batch, args)
        return jax.shard_map(run, mesh=mesh, in_specs=in_specs, out_specs=batch_and_heads, check_vma=False)(*args)

    return sharded


# The VJP is defined here, outside `shard_map`, rather than by the kernel's own custom VJP inside it: its
# residuals are then the layer's own arrays (the bias one stack's layers share) instead of per-layer copies
# that a `shard_map` returns, and its backward pass is traced inside interpret mode when that is on.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(query: Array, key: Array, value: Array, ab, segment_ids, causal: bool, how) -> Array:
    return _run(functools.partial(_forward, causal), how)(query, key, value, ab, segment_ids)[0]


def _attention_fwd(query: Array, key: Array, value: Array, ab, segment_ids, causal: bool, how):
    out, sums, maxes = _run(functools.partial(_forward, causal), how)(query, key, value, ab, segment_ids)
    return out, (query, key, value, ab, segment_ids, out, sums, maxes)


def _attention_bwd(causal: bool, how, residuals, d_out: Array):
    return (*_run(functools.partial(_backward, causal), how)(*residuals, d_out), None)  # no gradient of the ids


_attention.defvjp(_attention_fwd, _attention_bwd)


def padded(x: Array, axis: int, length: int, value: int = 0) -> Array:
    """`x` padded with `value` at the end of `axis` up to `length`."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def tpu_flash_attention(query: Array, key: Array, value: Array, mask: AttentionMask) -> Array:
    """query, key, value [b, h, len, d] (logits not scaled: sm_scale 1) attending as `mask` says
    -> context [b, h, q, d] in query's dtype."""
    platform = target_platform()
    if platform not in ("cpu", "tpu"):
        raise ValueError(
            f"attention_kernel='pallas_tpu_flash' runs on TPU (and interpreted on CPU), not on {platform!r}; "
            "use attention_kernel='cudnn' or 'xla' there"
        )
    (batch, heads, num_queries, _), num_keys = query.shape, key.shape[2]
    ab, ids = mask.bias, (mask.query_segment_ids, mask.key_segment_ids)
    if ab is not None:
        ab = jnp.broadcast_to(jnp.asarray(ab, query.dtype), (batch, heads, num_queries, num_keys))
    padded_q, padded_k = (-(-n // BLOCK) * BLOCK for n in (num_queries, num_keys))
    if (padded_q, padded_k) != (num_queries, num_keys):
        query = padded(query, 2, padded_q)
        key, value = padded(key, 2, padded_k), padded(value, 2, padded_k)
        ab = None if ab is None else padded(padded(ab, 2, padded_q), 3, padded_k)
        if ids[0] is None:
            ids = (jnp.ones((batch, num_queries), jnp.int32), jnp.ones((batch, num_keys), jnp.int32))
        ids = (padded(ids[0], 1, padded_q, PAD_SEGMENT), padded(ids[1], 1, padded_k, PAD_SEGMENT))
    segment_ids = None if ids[0] is None else SegmentIds(*(jnp.asarray(i, jnp.int32) for i in ids))
    mesh = jax.sharding.get_abstract_mesh()
    batch_and_heads = None if mesh.empty else nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
    how = (platform == "cpu", None if mesh.empty else mesh, batch_and_heads)
    return _attention(query, key, value, ab, segment_ids, mask.causal, how)[:, :, :num_queries]
