"""BART and mBART encoder-decoders in Flax linen, as Hugging Face builds them.

BART (Lewis et al., 2019): token embeddings (times sqrt(d_model) when
`scale_embedding`) plus learned absolute positions, a LayerNorm on that sum,
post-LN blocks (LN(x + sublayer(x))) with biased projections and GELU, and
logits against the token embedding shared by both stacks plus
`final_logits_bias`. Position p reads row p + 2 of a table of max_length + 2
rows (Hugging Face's offset; rows 0 and 1 are kept but never read).
mBART (Liu et al., 2020) is `pre_layer_norm=True` (x + sublayer(LN(x)), then
a final LayerNorm on each stack) with `scale_embedding=True`.
`final_logits_bias` [vocab] is a parameter here, so it trains; Hugging Face
keeps it as a buffer, so its parameter count is ours less vocab_size.

The interface is exactly T5's (`EncoderDecoderInterface`): `encode`, `decode`
and `__call__` take seqio EncDecFeatureConverter fields, so BART trains
through the same train step. Packed rows (segment ids 1, 2, ...; 0 =
padding) never attend across segments; pass `*_positions` so positions
restart per segment. The encoder masks keys equal to `pad_token_id` (HF BART
pads with 1, ptmjax's tasks with 0) and, in unpacked rows, the trailing 0s
seqio's converters pad with; the decoder is causal and, as in T5, not
padding-masked beyond causality and segments. seqio's converters weigh only
targets != 0, so a target holding id 0 (HF BART's `<s>`) is not trained on
unless its rows are built otherwise (ptmjax.load's scores weigh every target id).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

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
from ptmjax.layers.embed import EMBED_INIT_STDDEV, Embed
from ptmjax.layers.layer_stack import apply_layers
from ptmjax.layers.mlp import MlpBlock
from ptmjax.layers.norms import LayerNorm
from ptmjax.layers.pipeline import PipelineStages
from ptmjax.layers.positions import check_length, position_embedder, sequential_positions
from ptmjax.models.config import (
    ModelConfig,
    check_activation,
    check_attention_pattern,
    check_heads_divide,
    check_positive_ints,
)
from ptmjax.models.encoder_decoder import EncoderDecoderInterface

Array = jax.Array

POSITION_OFFSET = 2  # Hugging Face reads position p at row p + 2 of the table


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BartConfig(ModelConfig, PipelineStages):
    """Hyper-parameters of a BART or mBART encoder-decoder.

    head_dim = d_model // num_heads (both stacks share num_heads and d_ff).
    max_length: the longest sequence (HF max_position_embeddings); the position
      tables have max_length + 2 rows.
    pad_token_id: encoder keys with this id are masked (HF BART: 1; ptmjax tasks: 0).
    scale_embedding: multiply token embeddings by sqrt(d_model) (mBART, not BART).
    pre_layer_norm: mBART's pre-LN blocks plus a final LayerNorm on each stack;
      False is BART's post-LN.
    dropout_rate: embeddings and residual branches (HF dropout);
      attention_dropout_rate: attention probabilities (HF attention_dropout);
      activation_dropout_rate: after the feed-forward activation (HF activation_dropout).
    activation: 'gelu_exact' (erf, HF 'gelu') or 'gelu' (tanh, HF 'gelu_new'), 'relu', 'silu'.
    Keyword-only, as in every family (ptmjax/models/config.py): dropout_rate,
    layer_norm_epsilon, dtype, param_dtype, and remat_policy and scan_layers
    (what the backward pass recomputes of each layer, and one scan over each stack).
    Pipeline stages (pipeline_microbatches, pipeline_schedule, pipeline_repeats; ptmjax/layers/pipeline.py's
    PipelineStages) run both stacks as pipelines on a mesh with a stage axis, as GPT2Config's.
    attention_pattern: a sparse attention pattern (ptmjax/layers/attention_patterns.py) of the encoder's
      self-attention, ANDed with its padding and packing masks over each row's indices; the decoder attends
      densely. None: dense.
    """

    vocab_size: int
    d_model: int
    num_heads: int
    num_encoder_layers: int
    num_decoder_layers: int
    d_ff: int
    max_length: int = 1024
    pad_token_id: int = 1
    scale_embedding: bool = False
    pre_layer_norm: bool = False
    attention_dropout_rate: float = 0.0
    activation_dropout_rate: float = 0.0
    activation: str = "gelu_exact"
    layer_norm_epsilon: float = dataclasses.field(default=1e-5, kw_only=True)
    attention_pattern: AttentionPattern | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        check_positive_ints(
            self, "vocab_size", "d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "d_ff",
            "max_length",
        )
        check_heads_divide(self)
        check_activation(self)
        check_attention_pattern(self)
        self.check_model_config("attention_dropout_rate", "activation_dropout_rate")
        self.check_pipeline_fields()
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BartConfig.pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.vocab_size}); "
                "use 1 for Hugging Face BART vocabularies, 0 for ptmjax's."
            )
        for name in ("scale_embedding", "pre_layer_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"BartConfig.{name} must be True or False, got {getattr(self, name)!r}.")

    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        return {("encoder",): self.num_encoder_layers, ("decoder",): self.num_decoder_layers}

    def stack_depth_fields(self) -> dict[tuple[str, ...], str]:
        return {("encoder",): "num_encoder_layers", ("decoder",): "num_decoder_layers"}

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def embedding_scale(self) -> float:
        """The factor on token embeddings: sqrt(d_model) with scale_embedding, else 1."""
        return math.sqrt(self.d_model) if self.scale_embedding else 1.0


class BartLayer(nn.Module):
    """Self-attention, cross-attention (decoder layers only), feed-forward; each a normed residual branch.

    Post-LN (BART): x = LN(x + branch(x)). Pre-LN (mBART): x = x + branch(LN(x)).
    """

    config: BartConfig
    decoder: bool = False

    @nn.compact
    def __call__(
        self,
        x: Array,
        self_mask: AttentionMask,
        encoded: Array | None = None,
        cross_mask: AttentionMask | None = None,
        cache: CacheSlots | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        """x [b, l, embed], self_mask of [b, 1, l, l]; decoder: encoded [b, s, embed], cross_mask of [b, 1, l, s].

        Decoding (`cache`, decoder layers): as T5's DecoderLayer.
        """
        c = self.config
        drop = nn.Dropout(c.dropout_rate)

        def residual(x: Array, name: str, branch: Callable[[Array], Array]) -> Array:
            norm = LayerNorm(c.layer_norm_epsilon, name=f"{name}_layer_norm", **dtype_kwargs(c))
            h = branch(norm(x) if c.pre_layer_norm else x)
            x = x + drop(h, deterministic=not enable_dropout)
            return x if c.pre_layer_norm else norm(x)

        def attention(name: str, cross_attention: bool = False) -> MultiHeadAttention:
            pattern = None if self.decoder else c.attention_pattern  # the encoder's self-attention only
            return MultiHeadAttention(
                c.num_heads, c.head_dim, c.attention_dropout_rate, use_bias=True, scale_logits=True,
                cross_attention=cross_attention, attention_kernel=c.attention_kernel,
                performer_features=c.performer_features, attention_pattern=pattern, name=name, **dtype_kwargs(c),
            )

        self_name = "self_attention" if self.decoder else "attention"
        x = residual(x, self_name, lambda h: attention(self_name)(h, h, self_mask, enable_dropout, cache))
        if self.decoder:
            cross = "encoder_decoder_attention"
            x = residual(x, cross, lambda h: attention(cross, True)(h, encoded, cross_mask, enable_dropout, cache))
        mlp = MlpBlock(c.d_ff, (c.activation,), c.activation_dropout_rate, use_bias=True, name="mlp", **dtype_kwargs(c))
        x = residual(x, "mlp", lambda h: mlp(h, enable_dropout))
        x = nn.with_logical_constraint(x, HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


class BartStack(nn.Module):
    """Embeddings (scaled tokens + positions, LayerNorm, dropout), the layers, and mBART's final LayerNorm."""

    config: BartConfig
    shared_embedding: Embed
    decoder: bool = False

    @nn.compact
    def __call__(
        self,
        tokens: Array,
        positions: Array,
        self_mask: AttentionMask,
        encoded: Array | None = None,
        cross_mask: AttentionMask | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
    ) -> Array:
        """tokens [b, l], positions [b|1, l] (from 0) -> final hidden states [b, l, embed]."""
        c = self.config
        table = position_embedder(
            c.max_length + POSITION_OFFSET, c.d_model, EMBED_INIT_STDDEV, name="position_embedder", **dtype_kwargs(c)
        )
        x = self.shared_embedding(tokens) * c.embedding_scale + table(positions + POSITION_OFFSET)  # [b, l, embed]
        x = LayerNorm(c.layer_norm_epsilon, name="embedding_layer_norm", **dtype_kwargs(c))(x)
        x = nn.with_logical_constraint(nn.Dropout(c.dropout_rate)(x, deterministic=not enable_dropout), HIDDEN_AXES)
        num_layers = c.num_decoder_layers if self.decoder else c.num_encoder_layers
        stack = "decoder" if self.decoder else "encoder"
        x = apply_layers(
            BartLayer, c, num_layers, x, self_mask, encoded, cross_mask, cache, enable_dropout=enable_dropout,
            stack=(stack,), decoder=self.decoder,
        )
        if c.pre_layer_norm:
            x = LayerNorm(c.layer_norm_epsilon, name=f"{stack}_norm", **dtype_kwargs(c))(x)
        return nn.with_logical_constraint(x, HIDDEN_AXES)


class Bart(EncoderDecoderInterface):
    """BART / mBART: `__call__` = `logits(hidden_states(...))`, logits float32 [batch, target_len, vocab].

    Dropout draws from the 'dropout' rng collection when `enable_dropout=True`.
    Hidden states of every layer and attention probabilities are sown into 'intermediates'.
    """

    config: BartConfig

    def setup(self) -> None:
        c = self.config
        self.token_embedder = Embed(
            c.vocab_size, c.d_model, embedding_init=nn.initializers.normal(EMBED_INIT_STDDEV), **dtype_kwargs(c)
        )
        self.encoder = BartStack(c, self.token_embedder, decoder=False)
        self.decoder = BartStack(c, self.token_embedder, decoder=True)
        self.final_logits_bias = self.param(
            "final_logits_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (c.vocab_size,),
            dtype_kwargs(c)["param_dtype"],
        )

    def encode(
        self,
        encoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        encoder_positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        """[b, s] token ids -> encoded [b, s, embed]."""
        c, tokens = self.config, encoder_input_tokens
        check_token_inputs(
            "encoder_input_tokens", tokens, encoder_segment_ids=encoder_segment_ids,
            encoder_positions=encoder_positions,
        )
        check_length(tokens.shape[1], c.max_length, "Bart encoder")
        positions = sequential_positions(tokens) if encoder_positions is None else encoder_positions
        mask = encoder_attention_mask(tokens, encoder_segment_ids, c.pad_token_id)
        mask = mask.for_kernel(c.attention_kernel, c.compute_dtype)
        return self.encoder(tokens, positions, mask, enable_dropout=enable_dropout)

    def decoder_hidden_states(
        self,
        encoded: Array,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
    ) -> Array:
        """`decode`'s arguments -> the decoder's final hidden states [b, t, embed].

        Decoding: see `EncoderDecoderInterface`; positions are cache slots.
        """
        c, tokens = self.config, decoder_input_tokens
        check_token_inputs(
            "decoder_input_tokens", tokens, decoder_segment_ids=decoder_segment_ids,
            decoder_positions=decoder_positions,
        )
        check_length(tokens.shape[1] if cache is None else cache.length, c.max_length, "Bart decoder")
        if cache is None:
            positions = sequential_positions(tokens) if decoder_positions is None else decoder_positions
            self_mask = decoder_attention_mask(tokens, decoder_segment_ids)
        else:  # causal over the cache slots: no structured form
            positions = cache.query_slots(tokens.shape[1])[None]
            self_mask = AttentionMask(mask_to_bias(cache.causal_mask(tokens.shape[1]), c.compute_dtype))
        cross = cross_attention_mask(tokens, encoder_input_tokens, decoder_segment_ids, encoder_segment_ids,
                                     c.pad_token_id)
        self_mask, cross = (mask.for_kernel(c.attention_kernel, c.compute_dtype) for mask in (self_mask, cross))
        return self.decoder(tokens, positions, self_mask, encoded, cross, enable_dropout, cache)

    def logits(self, hidden_states: Array) -> Array:
        """The decoder's final hidden states [b, t, embed] -> logits float32 [b, t, vocab]."""
        dtype = dtype_kwargs(self.config)["dtype"]
        logits = self.token_embedder.attend(hidden_states) + jnp.asarray(self.final_logits_bias, dtype)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)
