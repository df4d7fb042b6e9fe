"""attention_kernel='splash': JAX's Pallas TPU splash-attention kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`), whose block-sparse mask skips the masked blocks.

The mask. Splash attention takes a static mask over query and key indices and cuts it into blocks of
BLOCK x BLOCK; a block the mask leaves entirely empty is neither loaded nor computed, forward or backward
(the kernel's `MaskInfo`: per query block the key blocks to visit). `splash_mask` builds that mask from the
`AttentionMask`'s causal flag and sparse pattern (ptmjax/layers/attention_patterns.py):
- no pattern: `CausalMask` or `FullMask`;
- `SlidingWindow(size)`: `LocalMask` with (size - 1) keys to the left and, unless causal, to the right;
  the kernel computes it inside its blocks from the indices, as it does the causal mask;
- any other pattern (dilated windows, global tokens, random blocks, fixed chunks, unions): `PatternMask`,
  which reads the pattern's own `allowed` rule block by block, ANDed with `CausalMask` when causal; its
  partly masked blocks are kept as boolean blocks (deduplicated) that the kernel loads.
Segment ids (packing, padding) are the kernel's `SegmentIds`, as for 'pallas_tpu_flash': a query attends
the keys of its own id, padding (0) to padding included, so outputs at padding positions differ from
the einsum path's while those at real positions (every loss and gradient) do not.

What it takes: no additive bias (T5's relative-position bias, a prefix LM's folded mask): those are
refused with a pointer to 'pallas_tpu_flash'. Lengths are padded up to a multiple of BLOCK with segment
id PAD_SEGMENT, which no real position has. Logits are not scaled (the layer scales the query).

Platforms and sharding: as 'pallas_tpu_flash' (ptmjax/layers/pallas_attention.py): compiled by Mosaic
on TPU, in Pallas's TPU interpret mode on CPU (slow: tests), refused elsewhere; under a mesh the kernel
runs in `jax.shard_map` over the batch and heads axes of the logical rules, each device building the
kernel for its own heads (one mask for every head). The kernel's own custom VJP gives the gradients.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info

from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.attention_patterns import AttentionPattern, SlidingWindow
from ptmjax.layers.common import target_platform
from ptmjax.layers.pallas_attention import BLOCK, PAD_SEGMENT, padded
from ptmjax.layers.precision import BFLOAT16, PLAIN

Array = jax.Array

# The precision policies (ptmjax/layers/precision.py) it takes: its blocks' products accumulate in float32.
POLICIES = {PLAIN: "float32 blocks", BFLOAT16: "bfloat16 blocks accumulated in float32"}


@dataclasses.dataclass(frozen=True, eq=True)
class PatternMask(masks.Mask):
    """A splash mask of shape (queries, keys) reading `pattern.allowed` over the indices of each slice."""

    pattern: AttentionPattern
    size: tuple[int, int]

    @property
    def shape(self) -> tuple[int, int]:
        return self.size

    def __getitem__(self, index: tuple[slice, slice]) -> np.ndarray:
        rows, columns = (np.arange(*part.indices(n)) for part, n in zip(index, self.size, strict=True))
        return np.asarray(self.pattern.allowed(rows, columns), bool)


@functools.lru_cache(maxsize=64)
def splash_mask(pattern: AttentionPattern | None, causal: bool, num_queries: int, num_keys: int) -> masks.Mask:
    """The splash mask [queries, keys] of a causal flag and a sparse pattern (None: dense) over the indices."""
    shape = (num_queries, num_keys)
    if isinstance(pattern, SlidingWindow):
        return masks.LocalMask(shape, (pattern.size - 1, 0 if causal else pattern.size - 1), offset=0)
    if pattern is None:
        return masks.CausalMask(shape) if causal else masks.FullMask(shape)
    return masks.CausalMask(shape) & PatternMask(pattern, shape) if causal else PatternMask(pattern, shape)


def live_blocks(pattern: AttentionPattern | None, causal: bool, num_queries: int, num_keys: int) -> np.ndarray:
    """bool [query blocks, key blocks]: the blocks of BLOCK x BLOCK that the kernel's forward pass computes; the
    others it skips. From the kernel's `MaskInfo`: step j of query block i visits key block `data_next[i, j]`,
    and computes it where `block_mask[i, j]` is nonzero (the grid is shrunk to the longest row of live blocks)."""
    mask = masks.MultiHeadMask([splash_mask(pattern, causal, num_queries, num_keys)])
    info, _ = mask_info.process_mask(mask, (BLOCK, BLOCK))
    steps, targets = np.asarray(info.block_mask)[0] > 0, np.asarray(info.data_next)[0]
    live = np.zeros((num_queries // BLOCK, num_keys // BLOCK), bool)
    rows = np.broadcast_to(np.arange(len(live))[:, None], steps.shape)
    live[rows[steps], targets[steps]] = True
    return live


@functools.lru_cache(maxsize=64)
def _kernel(pattern: AttentionPattern | None, causal: bool, heads: int, num_queries: int, num_keys: int,
            interpret: bool) -> splash.SplashAttentionKernel:
    mask = masks.MultiHeadMask([splash_mask(pattern, causal, num_queries, num_keys)] * heads)
    return splash.make_splash_mha_single_device(mask, block_sizes=splash.BlockSizes.get_default(),
                                                interpret=interpret)


def _run(query: Array, key: Array, value: Array, query_ids: Array, key_ids: Array, pattern, causal, interpret):
    """The kernel per example (vmapped over the batch) on [b, h, len, d] arrays, lengths multiples of BLOCK."""
    kernel = _kernel(pattern, causal, query.shape[1], query.shape[2], key.shape[2], interpret)
    return jax.vmap(lambda q, k, v, qi, ki: kernel(q, k, v, splash.SegmentIds(qi, ki)))(
        query, key, value, query_ids, key_ids)


def splash_attention(query: Array, key: Array, value: Array, mask: AttentionMask) -> Array:
    """query, key, value [b, h, len, d] (logits not scaled) attending as `mask` says (segment ids, causal flag,
    sparse pattern; no bias) -> context [b, h, q, d] in query's dtype."""
    platform = target_platform()
    if platform not in ("cpu", "tpu"):
        raise ValueError(f"attention_kernel='splash' runs on TPU (and interpreted on CPU), not on {platform!r}; "
                         "use attention_kernel='cudnn' or 'xla' there")
    if mask.bias is not None:
        raise ValueError("attention_kernel='splash' takes no additive bias (T5's relative-position bias, a prefix "
                         "LM's mask); use attention_kernel='pallas_tpu_flash' for such a mask")
    (batch, _, num_queries, _), num_keys = query.shape, key.shape[2]
    ids = [mask.query_segment_ids, mask.key_segment_ids]
    ids = [jnp.ones((batch, n), jnp.int32) if i is None else jnp.asarray(i, jnp.int32)
           for i, n in zip(ids, (num_queries, num_keys), strict=True)]
    padded_q, padded_k = (-(-n // BLOCK) * BLOCK for n in (num_queries, num_keys))
    query, ids[0] = padded(query, 2, padded_q), padded(ids[0], 1, padded_q, PAD_SEGMENT)
    key, value, ids[1] = padded(key, 2, padded_k), padded(value, 2, padded_k), padded(ids[1], 1, padded_k, PAD_SEGMENT)
    run = functools.partial(_run, pattern=mask.pattern, causal=mask.causal, interpret=platform == "cpu")
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        axes = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
        batch_and_heads, rows = jax.sharding.PartitionSpec(*axes), jax.sharding.PartitionSpec(axes[0])
        run = jax.shard_map(run, mesh=mesh, in_specs=(batch_and_heads,) * 3 + (rows,) * 2,
                            out_specs=batch_and_heads, check_vma=False)
    return run(query, key, value, *ids)[:, :, :num_queries].astype(query.dtype)
