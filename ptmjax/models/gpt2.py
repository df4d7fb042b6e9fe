"""GPT-2: a pre-LN decoder-only transformer with learned positions and tied embeddings.

One model trains causal, prefix-LM (UniLM-style) or bidirectional by mask
alone: `decoder_causal_attention` marks a bidirectional prefix per row, as
seqio's PrefixLM feature converter produces it. Packed rows (segment ids
1, 2, ...; 0 = padding) never attend across segments; pass
`decoder_positions` so each segment's positions restart at 0.

With `block_position_embeddings` (GLM, ptmjax/objectives/blank_infilling.py) a
second learned table adds the embedding of `decoder_block_positions`, a token's
position within its span (0 on GLM's part A), to that of `decoder_positions`.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.attention import CacheSlots, MultiHeadAttention, cached_self_mask
from ptmjax.layers.attention_mask import AttentionMask, decoder_attention_mask, mask_to_bias
from ptmjax.layers.attention_patterns import AttentionPattern
from ptmjax.layers.batch_broadcast import broadcast_batch
from ptmjax.layers.common import HIDDEN_AXES, LOGIT_AXES, check_token_inputs, dtype_kwargs
from ptmjax.layers.context_parallel import ContextMask
from ptmjax.layers.embed import EMBED_INIT_STDDEV, Embed
from ptmjax.layers.layer_stack import apply_layers
from ptmjax.layers.mlp import MlpBlock
from ptmjax.layers.moe import MoeConfig
from ptmjax.layers.norms import LayerNorm
from ptmjax.layers.pipeline import PipelineStages
from ptmjax.layers.positions import check_length, position_embedder, sequential_positions
from ptmjax.models.config import check_attention_pattern
from ptmjax.models.decoder_stack_config import DecoderStackConfig

Array = jax.Array



@gin.configurable
@dataclasses.dataclass(frozen=True)
class GPT2Config(MoeConfig, DecoderStackConfig, PipelineStages):
    """Hyper-parameters of a GPT-2 decoder: the decoder stack's sizes (vocab_size, d_model, num_heads,
    num_layers, d_ff: DecoderStackConfig, ptmjax/models/decoder_stack_config.py), then max_length.

    head_dim = d_model // num_heads. max_length is the size of the learned
    position table (HF n_positions). activation: 'gelu' is the tanh
    approximation (HF 'gelu_new'); 'gelu_exact' the erf form.
    dropout_rate applies to embeddings and residual branches (HF embd_pdrop and
    resid_pdrop), attention_dropout_rate to attention probabilities.

    Keyword-only, as in T5Config: the fields of every family (dropout_rate,
    layer_norm_epsilon, dtype, param_dtype, remat_policy, scan_layers; see
    ptmjax/models/config.py) and Mixture-of-Experts (num_experts, moe_every,
    moe_top_k, capacity factors, aux loss weights, jitter; see MoeConfig in
    ptmjax/layers/moe.py) and pipeline stages (pipeline_microbatches, pipeline_schedule,
    pipeline_repeats; see PipelineStages in ptmjax/layers/pipeline.py).
    MoE experts are bias-free Switch experts with `activation` (Hugging Face's
    GPT-2 has no MoE layers).
    block_position_embeddings: GLM's second position table (for `decoder_block_positions`, max_length
    entries); off in GPT-2.
    attention_pattern: a sparse attention pattern (ptmjax/layers/attention_patterns.py), ANDed with the
    causal, prefix and packing masks over each row's indices (decoding: over positions); None: dense. A
    pattern with a `window` (SlidingWindow, DilatedWindow) decodes with a ring-buffer cache of `window` slots.
    """

    max_length: int
    attention_dropout_rate: float = 0.1
    activation: str = "gelu"
    block_position_embeddings: bool = dataclasses.field(default=False, kw_only=True)
    attention_pattern: AttentionPattern | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.check_decoder_stack("max_length")
        check_attention_pattern(self)
        self.check_pipeline_fields()


class GPT2Block(nn.Module):
    """LayerNorm -> self-attention -> residual; LayerNorm -> MLP (dense or MoE) -> residual."""

    config: GPT2Config
    use_moe: bool = False

    @nn.compact
    def __call__(
        self, x: Array, mask: AttentionMask, cache: CacheSlots | None = None, enable_dropout: bool = False
    ) -> Array:
        """x [b, t, embed], mask of [b, 1, t, t] (decoding: [b, 1, t, cache.length]) -> [b, t, embed]."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        h = LayerNorm(c.layer_norm_epsilon, name="pre_attention_layer_norm", **dtype_kwargs(c))(x)
        h = MultiHeadAttention(
            c.num_heads, c.head_dim, c.attention_dropout_rate, use_bias=True, scale_logits=True,
            attention_kernel=c.attention_kernel, performer_features=c.performer_features,
            attention_pattern=c.attention_pattern, context_parallel=c.context_parallel_attention, name="attention",
            **dtype_kwargs(c),
        )(h, h, mask, enable_dropout, cache)
        x = x + drop(h, deterministic=not enable_dropout)
        h = LayerNorm(c.layer_norm_epsilon, name="pre_mlp_layer_norm", **dtype_kwargs(c))(x)
        if self.use_moe:
            mlp = c.moe_block(c.d_ff, (c.activation,), 0.0, name="mlp", **dtype_kwargs(c))
        else:
            mlp = MlpBlock(c.d_ff, (c.activation,), 0.0, use_bias=True, name="mlp", **dtype_kwargs(c))
        h = mlp(h, enable_dropout)
        x = nn.with_logical_constraint(x + drop(h, deterministic=not enable_dropout), HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


class GPT2(nn.Module):
    """GPT-2 language model: `__call__` gives float32 logits [b, t, vocab]; `hidden_states` the final-LN states.

    Inputs are seqio DecoderFeatureConverter / PrefixLM fields:
      decoder_input_tokens [b, t] int; decoder_segment_ids [b, t] (packing, 0 = padding);
      decoder_positions [b, t] (default 0..t-1); decoder_causal_attention [b, t]
      (1 on the bidirectional prefix; None = fully causal); with `block_position_embeddings`,
      decoder_block_positions [b, t] (GLM's position within a span; None = 0).
    Dropout draws from the 'dropout' rng when `enable_dropout=True`.

    Decoding (`cache`, layers.attention.CacheSlots, applied with mutable=['cache']):
    the tokens [b, l] fill cache slots cache.index, ..., with their
    `decoder_positions` [b, l]; `decoder_segment_ids` and `decoder_causal_attention`
    then cover every cache slot [b, cache.length], marking padding (0) and the
    bidirectional prefix. The first call with a cache creates it (see ptmjax/decoding).
    """

    config: GPT2Config

    def setup(self) -> None:
        c = self.config
        self.token_embedder = Embed(
            c.vocab_size, c.d_model, embedding_init=nn.initializers.normal(EMBED_INIT_STDDEV), **dtype_kwargs(c)
        )
        self.position_embedder = position_embedder(c.max_length, c.d_model, EMBED_INIT_STDDEV, **dtype_kwargs(c))
        if c.block_position_embeddings:
            self.block_position_embedder = position_embedder(
                c.max_length, c.d_model, EMBED_INIT_STDDEV, **dtype_kwargs(c)
            )
        self.decoder_norm = LayerNorm(c.layer_norm_epsilon, **dtype_kwargs(c))
        self.dropout = nn.Dropout(c.dropout_rate)

    @nn.compact
    def hidden_states(
        self,
        decoder_input_tokens: Array,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        decoder_causal_attention: Array | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
        decoder_block_positions: Array | None = None,
    ) -> Array:
        """-> final hidden states [b, t, embed], after the last LayerNorm; the layers are this method's children."""
        tokens = decoder_input_tokens
        slot_fields = {"decoder_segment_ids": decoder_segment_ids, "decoder_causal_attention": decoder_causal_attention}
        check_token_inputs(
            "decoder_input_tokens", tokens, decoder_positions=decoder_positions,
            decoder_block_positions=decoder_block_positions, **({} if cache else slot_fields),
        )
        length = tokens.shape[1]
        check_length(length if cache is None else cache.length, self.config.max_length, "GPT2")
        positions = sequential_positions(tokens) if decoder_positions is None else decoder_positions
        x = self.token_embedder(tokens) + broadcast_batch(self.position_embedder(positions), tokens.shape[0])
        x = x + self._block_position_embeddings(decoder_block_positions)
        x = nn.with_logical_constraint(self.dropout(x, deterministic=not enable_dropout), HIDDEN_AXES)
        if cache is None:  # the prefix LM's bidirectional prefix is folded into a bias where a kernel needs it
            mask = ContextMask.of(decoder_attention_mask(tokens, decoder_segment_ids), decoder_causal_attention)
        else:  # the cache's slots have no structured form
            pattern = self.config.attention_pattern
            if pattern is not None and pattern.window is not None and pattern.window < cache.length:
                cache = cache.replace(window=pattern.window)  # a ring buffer of the window's slots
            mask = AttentionMask(mask_to_bias(cached_self_mask(cache, length, decoder_segment_ids,
                                                               decoder_causal_attention, pattern, positions), x.dtype))
        mask = mask.for_kernel(self.config.attention_kernel, x.dtype)
        x = apply_layers(GPT2Block, self.config, self.config.num_layers, x, mask, cache, enable_dropout=enable_dropout)
        return nn.with_logical_constraint(self.decoder_norm(x), HIDDEN_AXES)

    def _block_position_embeddings(self, block_positions: Array | None) -> Array | float:
        """[b, t, embed] of GLM's block positions (None: position 0); 0 without the table."""
        if not self.config.block_position_embeddings:
            if block_positions is not None:
                raise ValueError(
                    "decoder_block_positions given, but GPT2Config.block_position_embeddings is False; set it "
                    "True (GLM) or drop the field"
                )
            return 0.0
        if block_positions is None:
            block_positions = jnp.zeros((1, 1), jnp.int32)
        return self.block_position_embedder(block_positions)

    def __call__(
        self,
        decoder_input_tokens: Array,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        decoder_causal_attention: Array | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
        decoder_block_positions: Array | None = None,
    ) -> Array:
        """-> logits float32 [b, t, vocab] against the (tied) token embedding."""
        x = self.hidden_states(
            decoder_input_tokens, decoder_segment_ids, decoder_positions, decoder_causal_attention, enable_dropout,
            cache, decoder_block_positions,
        )
        return self.logits(x)

    def logits(self, hidden_states: Array) -> Array:
        """Final hidden states [b, t, embed] -> logits float32 [b, t, vocab]."""
        logits = self.token_embedder.attend(hidden_states)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)
