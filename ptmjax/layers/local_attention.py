"""LongT5's encoder self-attention (Guo et al. 2022): local, and local plus transient global.

Local: a token attends the tokens at most `radius` positions away. Blockwise, as Hugging Face and flaxformer
compute it: the row is cut into blocks of `radius + 1`, each block's queries see the keys of the block before,
their own and the one after ([3 * block_len] keys), and a mask drops those farther than `radius`. Memory and
time grow with length * radius, not length**2.

Transient global (TGlobal): every token also attends the global tokens, each the layer-normed sum of one block
of `global_block_size` input tokens (ptmjax/layers/transient_global.py), projected by the same key and value
kernels, with a bias of their own over the distance in blocks.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers import precision
from ptmjax.layers.common import DType
from ptmjax.layers.dense import Dense
from ptmjax.layers.norms import RMSNorm
from ptmjax.layers.transient_global import global_aggregates

Array = jax.Array


def to_blocks(x: Array, block_len: int) -> Array:
    """x [b, s, ...] -> [b, ceil(s / block_len), block_len, ...], zero-padded at the end."""
    num_blocks = -(-x.shape[1] // block_len)
    pad = [(0, 0)] * x.ndim
    pad[1] = (0, num_blocks * block_len - x.shape[1])
    x = jnp.pad(x, pad)
    return x.reshape(x.shape[0], num_blocks, block_len, *x.shape[2:])


def three_blocks(x: Array) -> Array:
    """Blocks [b, n, block_len, ...] -> each with its neighbours [b, n, 3 * block_len, ...] (previous, own,
    next; zeros past the ends)."""
    pad = [(0, 0)] * x.ndim
    pad[1] = (1, 1)
    padded, n = jnp.pad(x, pad), x.shape[1]
    return jnp.concatenate([padded[:, i:i + n] for i in range(3)], axis=2)


def local_mask(segment_ids: Array, block_len: int) -> Array:
    """segment_ids [b, s] (0: padding) -> [b, n, 1, block_len, 3 * block_len] bool: a query sees the keys of
    its own segment at most block_len - 1 positions away."""
    query = to_blocks(segment_ids, block_len)  # [b, n, bl]
    key = three_blocks(query)  # [b, n, 3bl]
    distance = jnp.arange(3 * block_len)[None] - jnp.arange(block_len, 2 * block_len)[:, None]  # [bl, 3bl]
    near = jnp.abs(distance) < block_len
    same = (query[..., :, None] == key[..., None, :]) & (query[..., :, None] > 0)
    return (same & near)[:, :, None]


def window_positions(block_len: int) -> tuple[Array, Array]:
    """The positions of a block's queries [1, block_len] and of its 3-block window's keys [1, 3 * block_len]."""
    return jnp.arange(block_len, 2 * block_len)[None], jnp.arange(3 * block_len)[None]


@flax.struct.dataclass
class LocalAttentionBias:
    """What every layer of a LongT5 encoder adds to its logits, computed once per stack.

    local: [b|1, n, heads|1, block_len, 3 * block_len], the relative bias plus the mask.
    side: [b, n, heads, block_len, num_globals], the global tokens' bias plus their mask (TGlobal), else None.
    block_ids: [b, s], the global block of each token, -1 for none (TGlobal), else None.
    """

    local: Array
    side: Array | None = None
    block_ids: Array | None = None


class LocalSelfAttention(nn.Module):
    """x [b, s, embed] -> [b, s, embed], attending locally (and to global tokens when `bias.side` is given).

    Parameters as MultiHeadAttention's (query, key, value, out: bias-free, logits unscaled as T5's), plus
    `global_input_layer_norm` under TGlobal. Dropout on the attention probabilities, as T5's.
    """

    num_heads: int
    head_dim: int
    block_len: int
    dropout_rate: float = 0.0
    layer_norm_epsilon: float = 1e-6
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array, bias: LocalAttentionBias, enable_dropout: bool = False) -> Array:
        proj = dict(features=(self.num_heads, self.head_dim), kernel_axes=("embed", "heads", "kv"),
                    kernel_distribution="normal", dtype=self.dtype, param_dtype=self.param_dtype)
        key_proj, value_proj = Dense(name="key", **proj), Dense(name="value", **proj)
        query = to_blocks(Dense(name="query", kernel_scale=1.0 / self.head_dim, **proj)(x), self.block_len)
        key, value = (three_blocks(to_blocks(p(x), self.block_len)) for p in (key_proj, value_proj))
        logits = precision.einsum("bnqhd,bnkhd->bnhqk", query, key) + jnp.asarray(bias.local, self.dtype)
        if bias.side is not None:
            norm = RMSNorm(self.layer_norm_epsilon, name="global_input_layer_norm", dtype=self.dtype,
                           param_dtype=self.param_dtype)
            globals_ = norm(global_aggregates(x, bias.block_ids, bias.side.shape[-1]))  # [b, g, embed]
            side_key, side_value = key_proj(globals_), value_proj(globals_)  # [b, g, h, d]
            side_logits = precision.einsum("bnqhd,bghd->bnhqg", query, side_key)
            logits = jnp.concatenate([logits, side_logits + jnp.asarray(bias.side, self.dtype)], axis=-1)
        weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
        weights = nn.Dropout(self.dropout_rate)(weights, deterministic=not enable_dropout)
        window = 3 * self.block_len
        context = precision.einsum("bnhqk,bnkhd->bnqhd", weights[..., :window], value)
        if bias.side is not None:
            context = context + precision.einsum("bnhqg,bghd->bnqhd", weights[..., window:], side_value)
        context = context.reshape(x.shape[0], -1, self.num_heads, self.head_dim)[:, :x.shape[1]]
        out = Dense(name="out", features=(x.shape[-1],), axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                    kernel_distribution="normal", dtype=self.dtype, param_dtype=self.param_dtype)(context)
        return nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_embed"))
