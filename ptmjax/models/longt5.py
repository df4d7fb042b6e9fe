"""LongT5 (Guo et al. 2022): T5 v1.1 whose encoder attends locally or with transient global tokens.

The decoder, the embedding, the feed-forward blocks and the output layer are T5's (ptmjax/models/t5.py);
only the encoder's self-attention differs (ptmjax/layers/local_attention.py): each token sees the tokens
within `local_radius` ('local'), and under 'transient-global' also one summary token per `global_block_size`
input tokens. The encoder's relative bias covers a block's 3-block window (`relpos_bias`), TGlobal adds a
bias over block distances (`global_relpos_bias`); both are computed once per stack, as T5's.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.attention_mask import encoder_attention_mask, mask_to_bias
from ptmjax.layers.common import HIDDEN_AXES, dtype_kwargs
from ptmjax.layers.embed import Embed
from ptmjax.layers.layer_stack import apply_layers
from ptmjax.layers.local_attention import (
    LocalAttentionBias,
    LocalSelfAttention,
    local_mask,
    to_blocks,
    window_positions,
)
from ptmjax.layers.norms import RMSNorm
from ptmjax.layers.relative_position import RelativePositionBias
from ptmjax.layers.transient_global import global_block_ids
from ptmjax.models.config import check_positive_ints
from ptmjax.models.t5 import Decoder, EncoderDecoder, EncoderLayer, T5Config

Array = jax.Array
ENCODER_ATTENTION_TYPES = ("local", "transient-global")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LongT5Config(T5Config):
    """T5Config plus the encoder's attention (keyword-only):

    encoder_attention_type: 'local' or 'transient-global' (TGlobal).
    local_radius: how far a token sees on each side (LongT5: 127); blocks of local_radius + 1.
    global_block_size: input tokens per global token under TGlobal (LongT5: 16).
    """

    encoder_attention_type: str = dataclasses.field(default="local", kw_only=True)
    local_radius: int = dataclasses.field(default=127, kw_only=True)
    global_block_size: int = dataclasses.field(default=16, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.encoder_attention_type not in ENCODER_ATTENTION_TYPES:
            raise ValueError(f"LongT5Config.encoder_attention_type={self.encoder_attention_type!r} is unknown; use "
                             f"one of {list(ENCODER_ATTENTION_TYPES)}.")
        if self.hf_model_type is not None:
            raise ValueError(f"LongT5Config.hf_model_type={self.hf_model_type!r}: LongT5 has no variants; use None.")
        check_positive_ints(self, "local_radius", "global_block_size")
        if self.attention_pattern is not None:
            raise ValueError(f"LongT5Config.attention_pattern={self.attention_pattern!r}: LongT5's encoder attends "
                             "locally already (encoder_attention_type, local_radius); use None.")


class LongT5EncoderLayer(EncoderLayer):
    """T5's encoder layer with local (or TGlobal) self-attention."""

    config: LongT5Config

    def attend(self, h: Array, bias: LocalAttentionBias, enable_dropout: bool) -> Array:
        c = self.config
        return LocalSelfAttention(
            c.num_heads, c.head_dim, c.local_radius + 1, c.dropout_rate, c.layer_norm_epsilon, name="attention",
            **dtype_kwargs(c),
        )(h, bias, enable_dropout)


class LongT5Encoder(nn.Module):
    """Token ids [b, s] -> encoded [b, s, embed].

    Packed rows (segment_ids): local attention stays within a segment; TGlobal refuses them (its global
    blocks would mix segments). Positions are not read: a token's bias depends on its offset to the key alone.
    """

    config: LongT5Config
    shared_embedding: Embed

    @nn.compact
    def __call__(
        self, tokens: Array, segment_ids: Array | None = None, positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        x = self.shared_embedding(tokens).astype(c.compute_dtype)
        x = nn.with_logical_constraint(drop(x, deterministic=not enable_dropout), HIDDEN_AXES)
        bias = self.attention_bias(tokens, segment_ids)
        x = apply_layers(
            LongT5EncoderLayer, c, c.num_encoder_layers, x, bias, enable_dropout=enable_dropout, stack=("encoder",)
        )
        x = RMSNorm(c.layer_norm_epsilon, name="encoder_norm", **dtype_kwargs(c))(x)
        return nn.with_logical_constraint(drop(x, deterministic=not enable_dropout), HIDDEN_AXES)

    def attention_bias(self, tokens: Array, segment_ids: Array | None) -> LocalAttentionBias:
        """The biases every layer adds to its local (and global) logits; called in `__call__`'s scope."""
        c = self.config
        block_len, dtype = c.local_radius + 1, c.compute_dtype
        segments = encoder_attention_mask(tokens, segment_ids).key_segment_ids  # [b, s], 0: padding

        def table(name: str) -> RelativePositionBias:
            return RelativePositionBias(
                c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads,
                bidirectional=True, name=name, **dtype_kwargs(c),
            )

        local = table("relpos_bias")(*window_positions(block_len))[:, None]  # [1, 1, h, bl, 3bl]
        local = local + mask_to_bias(local_mask(segments, block_len), dtype)  # [b, n, h, bl, 3bl]
        if c.encoder_attention_type == "local":
            return LocalAttentionBias(local)
        if segment_ids is not None:
            raise ValueError("LongT5 encoder_attention_type='transient-global' takes unpacked rows only (its global "
                             "blocks would mix segments); got encoder_segment_ids: turn packing off (pack=False).")
        valid = segments > 0
        block_ids, exists = global_block_ids(valid, c.global_block_size)
        side = table("global_relpos_bias")(block_ids, jnp.arange(exists.shape[1])[None])  # [b, h, s, g]
        side = side + mask_to_bias(valid[:, None, :, None] & exists[:, None, None, :], dtype)
        side = jnp.swapaxes(to_blocks(jnp.swapaxes(side, 1, 2), block_len), 2, 3)  # [b, n, h, bl, g]
        return LocalAttentionBias(local, side, block_ids)


class LongT5(EncoderDecoder):
    """LongT5: T5's `EncoderDecoder` (the same methods, parameters and decoder) with `LongT5Encoder`."""

    config: LongT5Config

    def setup(self) -> None:
        c = self.config
        self.token_embedder = Embed(c.vocab_size, c.d_model, **dtype_kwargs(c))
        self.encoder = LongT5Encoder(c, self.token_embedder)
        self.decoder = Decoder(c, self.token_embedder)
