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

from ptmjax.layers.attention import (
    MultiHeadAttention,
    cross_mask,
    decoder_self_mask,
    encoder_self_mask,
    mask_to_bias,
)
from ptmjax.layers.common import DTYPES, HIDDEN_AXES, LOGIT_AXES, check_token_inputs
from ptmjax.layers.dense import Dense
from ptmjax.layers.embed import Embed
from ptmjax.layers.layer_stack import apply_layers
from ptmjax.layers.mlp import MlpBlock, check_activations
from ptmjax.layers.moe import MoeConfig
from ptmjax.layers.norms import RMSNorm
from ptmjax.layers.relative_position import RelativePositionBias
from ptmjax.models.encoder_decoder import EncoderDecoderInterface

Array = jax.Array

@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config(MoeConfig):
    """Hyper-parameters of a T5 encoder-decoder.

    ffn_activations: ('relu',) for T5 v1.0, ('gelu', 'linear') for v1.1 gated GELU.
    tie_embeddings: True (v1.0) computes logits as (hidden * d_model**-0.5) @ embedding.T;
      False (v1.1) uses a separate [embed, vocab] logits kernel and no scaling.
    dtype: activation/compute dtype ('float32' or 'bfloat16'); param_dtype: storage dtype.

    Mixture-of-Experts (num_experts, moe_every, moe_top_k, capacity factors, aux loss
    weights, jitter; see ptmjax/models/moe.py's MoeConfig), remat_policy and scan_layers
    (see ptmjax/models/layer_stack.py) are keyword-only options shared with GPT2Config.
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
    dropout_rate: float
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ffn_activations", tuple(self.ffn_activations))
        for name in (
            "vocab_size", "d_model", "num_heads", "head_dim", "d_ff",
            "num_encoder_layers", "num_decoder_layers",
            "relative_attention_num_buckets", "relative_attention_max_distance",
        ):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"T5Config.{name} must be a positive int, got {value!r}.")
        if self.relative_attention_num_buckets < 4:
            raise ValueError(
                f"T5Config.relative_attention_num_buckets={self.relative_attention_num_buckets} is too small; "
                "use at least 4 (T5 uses 32)."
            )
        check_activations(self.ffn_activations)
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}.")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"T5Config.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}.")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"T5Config.{name}={getattr(self, name)!r} is not supported; use one of {list(DTYPES)}."
                )
        self.check_layer_stacks()

    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        return {("encoder",): self.num_encoder_layers, ("decoder",): self.num_decoder_layers}

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(DTYPES[self.dtype])

    @property
    def weight_dtype(self) -> jnp.dtype:
        return jnp.dtype(DTYPES[self.param_dtype])


def _kw(config: T5Config) -> dict:
    return {"dtype": config.compute_dtype, "param_dtype": config.weight_dtype}


def _feed_forward(config: T5Config, use_moe: bool) -> nn.Module:
    """The block's feed-forward module, named 'mlp' whether dense or MoE."""
    c = config
    if use_moe:
        return c.moe_block(c.d_ff, c.ffn_activations, c.dropout_rate, name="mlp", **_kw(c))
    return MlpBlock(c.d_ff, c.ffn_activations, c.dropout_rate, name="mlp", **_kw(c))


def _positions(tokens: Array, positions: Array | None) -> Array:
    """Explicit positions [b, l], or 0..l-1 as [1, l]."""
    return jnp.arange(tokens.shape[1])[None] if positions is None else positions


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward (dense or MoE), each pre-normed and residual."""

    config: T5Config
    use_moe: bool = False

    @nn.compact
    def __call__(self, x: Array, bias: Array, enable_dropout: bool = False) -> Array:
        """x [b, s, embed], bias [b|1, heads, s, s] -> [b, s, embed]."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_attention_layer_norm", **_kw(c))(x)
        h = MultiHeadAttention(c.num_heads, c.head_dim, c.dropout_rate, name="attention", **_kw(c))(
            h, h, bias, enable_dropout
        )
        x = x + drop(h, deterministic=not enable_dropout)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_mlp_layer_norm", **_kw(c))(x)
        h = _feed_forward(c, self.use_moe)(h, enable_dropout)
        x = nn.with_logical_constraint(x + drop(h, deterministic=not enable_dropout), HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward (dense or MoE)."""

    config: T5Config
    use_moe: bool = False

    @nn.compact
    def __call__(
        self, x: Array, encoded: Array, self_bias: Array, cross_bias: Array, enable_dropout: bool = False
    ) -> Array:
        """x [b, t, embed], encoded [b, s, embed], self_bias [b|1, h, t, t], cross_bias [b, 1, t, s]."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        attn = dict(num_heads=c.num_heads, head_dim=c.head_dim, dropout_rate=c.dropout_rate, **_kw(c))
        h = RMSNorm(c.layer_norm_epsilon, name="pre_self_attention_layer_norm", **_kw(c))(x)
        h = MultiHeadAttention(name="self_attention", **attn)(h, h, self_bias, enable_dropout)
        x = x + drop(h, deterministic=not enable_dropout)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_cross_attention_layer_norm", **_kw(c))(x)
        h = MultiHeadAttention(name="encoder_decoder_attention", **attn)(h, encoded, cross_bias, enable_dropout)
        x = x + drop(h, deterministic=not enable_dropout)
        h = RMSNorm(c.layer_norm_epsilon, name="pre_mlp_layer_norm", **_kw(c))(x)
        h = _feed_forward(c, self.use_moe)(h, enable_dropout)
        x = nn.with_logical_constraint(x + drop(h, deterministic=not enable_dropout), HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


def _embed_with_position_bias(
    c: T5Config, embedding: Embed, drop: nn.Dropout, tokens: Array, positions: Array | None,
    bidirectional: bool, enable_dropout: bool,
) -> tuple[Array, Array]:
    """The start of a stack: embedded tokens [b, l, embed] and its relative bias [b|1, h, l, l].

    Called inside a stack's compact `__call__`, so the bias module is that stack's child.
    """
    x = embedding(tokens).astype(c.compute_dtype)
    x = nn.with_logical_constraint(drop(x, deterministic=not enable_dropout), HIDDEN_AXES)
    pos = _positions(tokens, positions)
    bias = RelativePositionBias(
        c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads,
        bidirectional=bidirectional, name="relpos_bias", **_kw(c),
    )(pos, pos)  # fmt: skip
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
        x, bias = _embed_with_position_bias(c, self.shared_embedding, drop, tokens, positions, True, enable_dropout)
        bias = bias + mask_to_bias(encoder_self_mask(tokens, segment_ids), c.compute_dtype)  # [b, h, s, s]
        x = apply_layers(EncoderLayer, c, c.num_encoder_layers, x, bias, enable_dropout=enable_dropout)
        x = RMSNorm(c.layer_norm_epsilon, name="encoder_norm", **_kw(c))(x)
        return nn.with_logical_constraint(drop(x, deterministic=not enable_dropout), HIDDEN_AXES)


class Decoder(nn.Module):
    """Decoder token ids [b, t] and encoded [b, s, embed] -> float32 logits [b, t, vocab]."""

    config: T5Config
    shared_embedding: Embed

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
    ) -> Array:
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        x, self_bias = _embed_with_position_bias(
            c, self.shared_embedding, drop, tokens, positions, False, enable_dropout
        )
        self_bias = self_bias + mask_to_bias(decoder_self_mask(tokens, segment_ids), c.compute_dtype)
        cross = cross_mask(tokens, encoder_tokens, segment_ids, encoder_segment_ids)
        cross_bias = mask_to_bias(cross, c.compute_dtype)  # [b, 1, t, s]
        x = apply_layers(
            DecoderLayer, c, c.num_decoder_layers, x, encoded, self_bias, cross_bias, enable_dropout=enable_dropout
        )
        x = RMSNorm(c.layer_norm_epsilon, name="decoder_norm", **_kw(c))(x)
        x = drop(x, deterministic=not enable_dropout)  # [b, t, embed]
        if c.tie_embeddings:
            logits = self.shared_embedding.attend(x * (c.d_model**-0.5))
        else:
            logits = Dense((c.vocab_size,), ("embed", "vocab"), name="logits_dense", **_kw(c))(x)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)  # [b, t, vocab]


class EncoderDecoder(EncoderDecoderInterface):
    """T5: `__call__` = `decode(encode(...))`, logits float32 [batch, target_len, vocab].

    Dropout draws from the 'dropout' rng collection when `enable_dropout=True`.
    Hidden states and attention probabilities are sown into 'intermediates'.
    MoE layers sow their weighted auxiliary losses into 'losses' (see ptmjax/models/moe.py).
    """

    config: T5Config

    def setup(self) -> None:
        c = self.config
        self.token_embedder = Embed(c.vocab_size, c.d_model, **_kw(c))
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
        )  # fmt: skip
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout)

    def decode(
        self,
        encoded: Array,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        """encoded [b, s, embed], encoder tokens [b, s] (for the mask), decoder tokens [b, t]

        -> logits [b, t, vocab].
        """
        check_token_inputs(
            "decoder_input_tokens", decoder_input_tokens,
            decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
        )  # fmt: skip
        return self.decoder(
            encoded, encoder_input_tokens, decoder_input_tokens,
            encoder_segment_ids, decoder_segment_ids, decoder_positions, enable_dropout,
        )  # fmt: skip
