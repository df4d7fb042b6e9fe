"""T5 encoder-decoder (v1.0 and v1.1) in Flax linen.

Pre-norm residual blocks with RMS norm, bias-free dense layers, relative
position bias computed once per stack and shared by its layers, token
embedding shared by encoder and decoder (and by the output layer when tied).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.attention import CacheSlots, MultiHeadAttention
from ptmjax.layers.attention_mask import (
    AttentionMask,
    cross_attention_mask,
    decoder_attention_mask,
    encoder_attention_mask,
    mask_to_bias,
)
from ptmjax.layers.attention_patterns import AttentionPattern
from ptmjax.layers.common import HIDDEN_AXES, LOGIT_AXES, check_token_inputs, dtype_kwargs
from ptmjax.layers.context_parallel import ContextMask
from ptmjax.layers.dense import Dense
from ptmjax.layers.embed import Embed
from ptmjax.layers.layer_stack import apply_layers
from ptmjax.layers.mlp import MlpBlock, check_activations
from ptmjax.layers.moe import MoeConfig
from ptmjax.layers.norms import RMSNorm
from ptmjax.layers.pipeline import PipelineStages
from ptmjax.layers.relative_position import PositionBias, RelativePositionBias
from ptmjax.models.config import ModelConfig, check_attention_pattern, check_positive_ints
from ptmjax.models.encoder_decoder import EncoderDecoderInterface

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config(MoeConfig, ModelConfig, PipelineStages):
    """Hyper-parameters of a T5 encoder-decoder.

    ffn_activations: ('relu',) for T5 v1.0, ('gelu', 'linear') for v1.1 gated GELU.
    tie_embeddings: True (v1.0) computes logits as (hidden * d_model**-0.5) @ embedding.T;
      False (v1.1) uses a separate [embed, vocab] logits kernel and no scaling.
    dropout_rate (required), layer_norm_epsilon, dtype, param_dtype, remat_policy and
    scan_layers are the keyword-only fields of every family (ptmjax/models/config.py);
    Mixture-of-Experts (num_experts, moe_every, moe_top_k, capacity factors, aux loss
    weights, jitter; ptmjax/layers/moe.py's MoeConfig) are keyword-only options shared
    with GPT2Config.
    Pipeline stages (pipeline_microbatches, pipeline_schedule, pipeline_repeats; ptmjax/layers/pipeline.py's
    PipelineStages) run both stacks as pipelines on a mesh with a stage axis, as GPT2Config's.
    hf_model_type: 'mt5' for mT5 (T5 v1.1 over a 250k-piece multilingual vocabulary), which
      Hugging Face exports as MT5ForConditionalGeneration; None: T5. It changes nothing computed.
    attention_pattern: a sparse attention pattern (ptmjax/layers/attention_patterns.py) of the encoder's
      self-attention, ANDed with its padding and packing masks over each row's indices; the decoder attends
      densely. None: dense.
    """

    vocab_size: int
    d_model: int
    num_heads: int
    head_dim: int
    d_ff: int
    num_encoder_layers: int
    num_decoder_layers: int
    ffn_activations: tuple[str, ...]
    tie_embeddings: bool
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = dataclasses.field(kw_only=True)
    hf_model_type: str | None = dataclasses.field(default=None, kw_only=True)
    attention_pattern: AttentionPattern | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ffn_activations", tuple(self.ffn_activations))
        if self.hf_model_type not in (None, "mt5"):
            raise ValueError(f"T5Config.hf_model_type={self.hf_model_type!r} is unknown; use None (T5) or 'mt5'.")
        if self.hf_model_type == "mt5" and self.tie_embeddings:
            raise ValueError("T5Config.hf_model_type='mt5' has its own unscaled output layer, as T5 v1.1: set "
                             "tie_embeddings=False.")
        check_positive_ints(
            self, "vocab_size", "d_model", "num_heads", "head_dim", "d_ff", "num_encoder_layers",
            "num_decoder_layers", "relative_attention_num_buckets", "relative_attention_max_distance",
        )
        if self.relative_attention_num_buckets < 4:
            raise ValueError(
                f"T5Config.relative_attention_num_buckets={self.relative_attention_num_buckets} is too small; "
                "use at least 4 (T5 uses 32)."
            )
        check_activations(self.ffn_activations)
        check_attention_pattern(self)
        self.check_model_config()
        self.check_pipeline_fields()

    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        return {("encoder",): self.num_encoder_layers, ("decoder",): self.num_decoder_layers}

    def stack_depth_fields(self) -> dict[tuple[str, ...], str]:
        return {("encoder",): "num_encoder_layers", ("decoder",): "num_decoder_layers"}


def _feed_forward(config: T5Config, use_moe: bool) -> nn.Module:
    """The block's feed-forward module, named 'mlp' whether dense or MoE."""
    c = config
    if use_moe:
        return c.moe_block(c.d_ff, c.ffn_activations, c.dropout_rate, name="mlp", **dtype_kwargs(c))
    return MlpBlock(c.d_ff, c.ffn_activations, c.dropout_rate, name="mlp", **dtype_kwargs(c))


def _positions(tokens: Array, positions: Array | None) -> Array:
    """Explicit positions [b, l], or 0..l-1 as [1, l]."""
    return jnp.arange(tokens.shape[1])[None] if positions is None else positions


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward (dense or MoE), each pre-normed and residual."""

    config: T5Config
    use_moe: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: AttentionMask, enable_dropout: bool = False) -> Array:
        """x [b, s, embed], mask of [b, heads, s, s] -> [b, s, embed]."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_attention_layer_norm", **dtype_kwargs(c))(x)
        x = x + drop(self.attend(h, mask, enable_dropout), deterministic=not enable_dropout)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_mlp_layer_norm", **dtype_kwargs(c))(x)
        h = _feed_forward(c, self.use_moe)(h, enable_dropout)
        x = nn.with_logical_constraint(x + drop(h, deterministic=not enable_dropout), HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x

    def attend(self, h: Array, mask: AttentionMask, enable_dropout: bool) -> Array:
        """Self-attention of the normed input, as the submodule 'attention' (LongT5's layer attends locally)."""
        c = self.config
        return MultiHeadAttention(
            c.num_heads, c.head_dim, c.dropout_rate, attention_kernel=c.attention_kernel,
            attention_pattern=c.attention_pattern, context_parallel=c.context_parallel_attention, name="attention",
            **dtype_kwargs(c),
        )(h, h, mask, enable_dropout)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward (dense or MoE)."""

    config: T5Config
    use_moe: bool = False

    @nn.compact
    def __call__(
        self, x: Array, encoded: Array | None, self_mask: AttentionMask, cross_mask: AttentionMask,
        cache: CacheSlots | None = None, enable_dropout: bool = False,
    ) -> Array:
        """x [b, t, embed], encoded [b, s, embed], self_mask of [b, h, t, t], cross_mask of [b, h, t, s].

        Decoding (`cache`): self_mask covers the cache slots [.., t, cache.length]; encoded is None
        after the first call (the cross-attention keys are cached).
        """
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        attn = dict(
            num_heads=c.num_heads, head_dim=c.head_dim, dropout_rate=c.dropout_rate,
            attention_kernel=c.attention_kernel, **dtype_kwargs(c),
        )
        h = RMSNorm(c.layer_norm_epsilon, name="pre_self_attention_layer_norm", **dtype_kwargs(c))(x)
        h = MultiHeadAttention(name="self_attention", context_parallel=c.context_parallel_attention, **attn)(
            h, h, self_mask, enable_dropout, cache
        )
        x = x + drop(h, deterministic=not enable_dropout)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_cross_attention_layer_norm", **dtype_kwargs(c))(x)
        h = MultiHeadAttention(name="encoder_decoder_attention", cross_attention=True, **attn)(
            h, encoded, cross_mask, enable_dropout, cache
        )
        x = x + drop(h, deterministic=not enable_dropout)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_mlp_layer_norm", **dtype_kwargs(c))(x)
        h = _feed_forward(c, self.use_moe)(h, enable_dropout)
        x = nn.with_logical_constraint(x + drop(h, deterministic=not enable_dropout), HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


def _embed_with_position_bias(
    c: T5Config, embedding: Embed, drop: nn.Dropout, tokens: Array, query_positions: Array,
    key_positions: Array, bidirectional: bool, enable_dropout: bool, structured: bool = True,
) -> tuple[Array, PositionBias | Array]:
    """The start of a stack: embedded tokens [b, q, embed] and its relative bias (`structured`: its table and
    positions, computed where an attention reads it; else the whole [b|1, h, q, k]).

    Called inside a stack's compact `__call__`, so the bias module is that stack's child.
    """
    x = embedding(tokens).astype(c.compute_dtype)
    x = nn.with_logical_constraint(drop(x, deterministic=not enable_dropout), HIDDEN_AXES)
    bias = RelativePositionBias(
        c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads,
        bidirectional=bidirectional, name="relpos_bias", **dtype_kwargs(c),
    )(query_positions, key_positions, structured)
    return x, bias


class Encoder(nn.Module):
    """Token ids [b, s] -> encoded [b, s, embed]."""

    config: T5Config
    shared_embedding: Embed

    @nn.compact
    def __call__(
        self,
        tokens: Array,
        segment_ids: Array | None = None,
        positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        pos = _positions(tokens, positions)
        x, bias = _embed_with_position_bias(c, self.shared_embedding, drop, tokens, pos, pos, True, enable_dropout)
        mask = ContextMask.of(encoder_attention_mask(tokens, segment_ids), position_bias=bias)
        mask = mask.for_kernel(c.attention_kernel, c.compute_dtype)
        x = apply_layers(
            EncoderLayer, c, c.num_encoder_layers, x, mask, enable_dropout=enable_dropout, stack=("encoder",)
        )
        x = RMSNorm(c.layer_norm_epsilon, name="encoder_norm", **dtype_kwargs(c))(x)
        return nn.with_logical_constraint(drop(x, deterministic=not enable_dropout), HIDDEN_AXES)


class Decoder(nn.Module):
    """Decoder token ids [b, t] and encoded [b, s, embed] -> final hidden states [b, t, embed] (`__call__`)
    -> float32 logits [b, t, vocab] (`logits`).

    Decoding (`cache`): the tokens fill cache slots cache.index, ... and attend causally to the
    cache; their relative positions are their slots.
    """

    config: T5Config
    shared_embedding: Embed

    def setup(self) -> None:
        c = self.config
        if not c.tie_embeddings:
            self.logits_dense = Dense((c.vocab_size,), ("embed", "vocab"), **dtype_kwargs(c))

    @nn.compact
    def __call__(
        self,
        encoded: Array,
        encoder_tokens: Array,
        tokens: Array,
        encoder_segment_ids: Array | None = None,
        segment_ids: Array | None = None,
        positions: Array | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
    ) -> Array:
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        if cache is None:
            query_pos = key_pos = _positions(tokens, positions)
        else:
            query_pos, key_pos = cache.query_slots(tokens.shape[1])[None], cache.key_slots()[None]
        x, self_bias = _embed_with_position_bias(
            c, self.shared_embedding, drop, tokens, query_pos, key_pos, False, enable_dropout, cache is None
        )
        if cache is None:
            self_mask = ContextMask.of(decoder_attention_mask(tokens, segment_ids), position_bias=self_bias)
        else:  # causal over the cache slots [1, 1, t, cache length]: no structured form
            self_mask = AttentionMask(self_bias + mask_to_bias(cache.causal_mask(tokens.shape[1]), c.compute_dtype))
        cross_mask = cross_attention_mask(tokens, encoder_tokens, segment_ids, encoder_segment_ids)
        masks = (mask.for_kernel(c.attention_kernel, c.compute_dtype) for mask in (self_mask, cross_mask))
        x = apply_layers(
            DecoderLayer, c, c.num_decoder_layers, x, encoded, *masks, cache, enable_dropout=enable_dropout,
            stack=("decoder",),
        )
        x = RMSNorm(c.layer_norm_epsilon, name="decoder_norm", **dtype_kwargs(c))(x)
        return drop(x, deterministic=not enable_dropout)  # [b, t, embed]

    def logits(self, hidden_states: Array) -> Array:
        """Final hidden states [b, t, embed] -> logits float32 [b, t, vocab]."""
        c = self.config
        if c.tie_embeddings:
            logits = self.shared_embedding.attend(hidden_states * (c.d_model**-0.5))
        else:
            logits = self.logits_dense(hidden_states)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)  # [b, t, vocab]


class EncoderDecoder(EncoderDecoderInterface):
    """T5: `__call__` = `logits(hidden_states(...))`, logits float32 [batch, target_len, vocab].

    The T5 family's class (T5, T5 v1.1, mT5, T5 MoE / Switch), named as T5X's; the other encoder-decoder
    family is `Bart` (ptmjax/models/bart.py), and both share `EncoderDecoderInterface`.

    Dropout draws from the 'dropout' rng collection when `enable_dropout=True`.
    Hidden states and attention probabilities are sown into 'intermediates'.
    MoE layers sow their weighted auxiliary losses into 'losses' (see ptmjax/layers/moe.py).
    """

    config: T5Config

    def setup(self) -> None:
        c = self.config
        self.token_embedder = Embed(c.vocab_size, c.d_model, **dtype_kwargs(c))
        self.encoder = Encoder(c, self.token_embedder)
        self.decoder = Decoder(c, self.token_embedder)

    def encode(
        self,
        encoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        encoder_positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        """[b, s] token ids -> encoded [b, s, embed]."""
        check_token_inputs(
            "encoder_input_tokens", encoder_input_tokens,
            encoder_segment_ids=encoder_segment_ids, encoder_positions=encoder_positions,
        )
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout)

    def decoder_hidden_states(
        self,
        encoded: Array | None,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
    ) -> Array:
        """`decode`'s arguments -> the decoder's final hidden states [b, t, embed]."""
        check_token_inputs(
            "decoder_input_tokens", decoder_input_tokens,
            decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
        )
        return self.decoder(
            encoded, encoder_input_tokens, decoder_input_tokens,
            encoder_segment_ids, decoder_segment_ids, decoder_positions, enable_dropout, cache,
        )

    def logits(self, hidden_states: Array) -> Array:
        """The decoder's final hidden states [b, t, embed] -> logits float32 [b, t, vocab]."""
        return self.decoder.logits(hidden_states)
