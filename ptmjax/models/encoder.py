"""The post-LN encoder shared by BERT, RoBERTa, ALBERT and ELECTRA, and its MLM / sentence-pair wiring.

`PostLNEncoder` is the backbone: embeddings (token, position, token type and,
with `num_languages`, XLM's language embedding; width `embed_dim`, LayerNorm,
dropout), an optional projection embed_dim -> d_model (ALBERT's
embedding_hidden_mapping_in, ELECTRA's embeddings_project), then num_layers
post-LN layers, with optional cross-layer parameter sharing (ALBERT).
`MaskedLMEncoder` adds the MLM head and, when the config asks, the tanh pooler
with a 2-way sentence-pair classifier (BERT's NSP, ALBERT's SOP).
Model classes subclass these, so every family has the same backbone parameter
paths: `embeddings/...`, `embedding_projection`, `layers_{i}`.

The attention mask comes from `input_tokens != pad_token_id`. Token types are
called `token_type_ids` (not segment ids) because segment ids mean packing in ptmjax.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import AttentionMask, encoder_attention_mask, mask_to_bias
from ptmjax.layers.attention_patterns import AttentionPattern
from ptmjax.layers.batch_broadcast import broadcast_batch
from ptmjax.layers.common import HIDDEN_AXES, dtype_kwargs
from ptmjax.layers.dense import Dense
from ptmjax.layers.embed import EMBED_INIT_STDDEV, Embed
from ptmjax.layers.layer_stack import apply_layers
from ptmjax.layers.mlp import MlpBlock
from ptmjax.layers.norms import LayerNorm
from ptmjax.layers.positions import check_length, position_embedder, positions_after_padding, sequential_positions
from ptmjax.models.config import (
    ModelConfig,
    check_activation,
    check_attention_pattern,
    check_heads_divide,
    check_positive_ints,
)
from ptmjax.models.encoder_heads import MlmHead, SentencePairHead

Array = jax.Array



@dataclasses.dataclass(frozen=True)
class EncoderConfig(ModelConfig):
    """Hyper-parameters of the shared post-LN encoder; the family configs subclass it.

    head_dim = d_model // num_heads; max_length is the position table size
    (HF max_position_embeddings; RoBERTa's 514 = 512 + pad_token_id + 1).
    embedding_size: width E of the embedding tables when factorized (ALBERT,
      ELECTRA), with a learned projection E -> d_model; None = d_model, no projection.
    num_layer_groups: cross-layer parameter sharing (ALBERT's num_hidden_groups):
      the layers form this many consecutive groups, each group one set of
      parameters (1 = all layers share one); None = every layer its own.
    type_vocab_size: rows of the token-type table; 0: none, and no token types taken (MPNet).
    positions_after_padding: RoBERTa position ids, counting non-padding tokens
      from pad_token_id + 1 (as Hugging Face computes them).
    activation: 'gelu_exact' (erf, HF 'gelu') or 'gelu' (tanh, HF 'gelu_new'), 'relu', 'silu'.
    num_languages: rows of XLM's language table (Lample & Conneau, 2019), added to the token, position and
      type embeddings from 'language_ids' [b, s] (none given: language 0); with it the model reads the
      translation-LM features ('positions' restarting at a pair's second half, 'language_ids'). 0: none.
    attention_pattern: a sparse attention pattern (ptmjax/layers/attention_patterns.py) of the post-LN layers'
      self-attention, ANDed with the padding mask over each row's indices; None: dense (MPNet refuses one).
    Keyword-only, as in every family (ptmjax/models/config.py): dropout_rate,
    layer_norm_epsilon, dtype, param_dtype, and remat_policy and scan_layers
    (one scan over the layers, or over the groups of shared layers).
    """

    vocab_size: int
    d_model: int
    num_heads: int
    num_layers: int
    d_ff: int
    max_length: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    positions_after_padding: bool = False
    embedding_size: int | None = None
    num_layer_groups: int | None = None
    attention_dropout_rate: float = 0.1
    activation: str = "gelu_exact"
    layer_norm_epsilon: float = dataclasses.field(default=1e-12, kw_only=True)
    num_languages: int = dataclasses.field(default=0, kw_only=True)
    attention_pattern: AttentionPattern | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_positive_ints(self, "vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_length")
        check_attention_pattern(self)
        if self.num_languages < 0:
            raise ValueError(f"{owner}.num_languages={self.num_languages} must be 0 (no language embedding) or more.")
        if self.num_languages and self.pair_head:
            raise ValueError(f"{owner}.num_languages={self.num_languages} trains on translation-LM rows, which have no "
                             "sentence-pair labels: turn the sentence-pair head off (nsp_head / sop_head = False).")
        if self.type_vocab_size < 0:
            raise ValueError(f"{owner}.type_vocab_size={self.type_vocab_size} must be 0 (no token types) or more.")
        check_heads_divide(self)
        check_activation(self)
        if self.embedding_size is not None:
            check_positive_ints(self, "embedding_size")
        if self.num_layer_groups is not None:
            check_positive_ints(self, "num_layer_groups")
            if self.num_layers % self.num_layer_groups:
                raise ValueError(
                    f"{owner}.num_layer_groups={self.num_layer_groups} does not divide num_layers={self.num_layers}; "
                    "pick a divisor (1 shares one set of layer parameters across all layers)."
                )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"{owner}.pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})."
            )
        if self.positions_after_padding and self.max_length <= self.pad_token_id + 1:
            raise ValueError(
                f"{owner}.max_length={self.max_length} leaves no positions after pad_token_id + 1 = "
                f"{self.pad_token_id + 1}; use max_length = longest sequence + pad_token_id + 1."
            )
        self.check_model_config("attention_dropout_rate")

    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        return {(): self.layer_groups}

    def stack_depth_fields(self) -> dict[tuple[str, ...], str]:
        if self.layer_groups != self.num_layers:
            raise ValueError(
                f"{type(self).__name__}.num_layer_groups={self.num_layer_groups} shares parameters across its "
                f"{self.num_layers} layers, so no layer can be pruned alone; set num_layers to the depth you want."
            )
        return {(): "num_layers"}

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def embed_dim(self) -> int:
        """Width of the embedding tables (E)."""
        return self.d_model if self.embedding_size is None else self.embedding_size

    @property
    def layer_groups(self) -> int:
        """Number of distinct sets of layer parameters."""
        return self.num_layers if self.num_layer_groups is None else self.num_layer_groups

    @property
    def max_sequence_length(self) -> int:
        """The longest input the position table covers."""
        return self.max_length - (self.pad_token_id + 1 if self.positions_after_padding else 0)

    @property
    def pair_head(self) -> bool:
        """Whether `MaskedLMEncoder` builds the pooler and sentence-pair classifier (family configs override)."""
        return False

    @property
    def pair_dropout_rate(self) -> float:
        """Dropout on the pooled output before the sentence-pair classifier."""
        return 0.0

    @property
    def mlm_activation(self) -> str:
        """Activation of the MLM head's transform."""
        return self.activation

    @property
    def classifier_activation(self) -> str | None:
        """The sequence classifier: None = BERT's tanh pooler then a linear classifier; else the activation of
        a dense + activation + out_proj head on the first token (RoBERTa 'tanh', ELECTRA 'gelu_exact')."""
        return None

    @property
    def classifier_dropout_rate_default(self) -> float:
        """Dropout before a fine-tuning classifier when the model sets none (HF: hidden_dropout_prob)."""
        return self.dropout_rate


class Embeddings(nn.Module):
    """Token + position + token-type (+ language) embeddings, LayerNorm, dropout: ids [b, s] -> [b, s, embed_dim]."""

    config: EncoderConfig

    def setup(self) -> None:
        c = self.config
        table_init = nn.initializers.normal(EMBED_INIT_STDDEV)
        self.token_embedder = Embed(c.vocab_size, c.embed_dim, embedding_init=table_init, **dtype_kwargs(c))
        self.position_embedder = position_embedder(c.max_length, c.embed_dim, EMBED_INIT_STDDEV, **dtype_kwargs(c))
        if c.type_vocab_size:
            self.token_type_embedder = Embed(
                c.type_vocab_size, c.embed_dim, axes=("token_type", "embed"), embedding_init=table_init,
                **dtype_kwargs(c),
            )
        if c.num_languages:
            self.language_embedder = Embed(
                c.num_languages, c.embed_dim, axes=("language", "embed"), embedding_init=table_init, **dtype_kwargs(c)
            )
        self.layer_norm = LayerNorm(c.layer_norm_epsilon, **dtype_kwargs(c))
        self.dropout = nn.Dropout(c.dropout_rate)

    def __call__(
        self, input_tokens: Array, token_type_ids: Array | None, enable_dropout: bool = False,
        position_ids: Array | None = None, language_ids: Array | None = None,
    ) -> Array:
        """position_ids [b, s]: rows of the position table (MPNet's permuted order); None: the config's positions.
        language_ids [b, s]: rows of the language table (needs `num_languages`); None: language 0."""
        c = self.config
        if position_ids is None and c.positions_after_padding:
            position_ids = positions_after_padding(input_tokens, c.pad_token_id)  # [b, s]
        elif position_ids is None:
            position_ids = sequential_positions(input_tokens)  # [1, s]
        x = self.token_embedder(input_tokens)
        if c.type_vocab_size:
            x = x + self.token_type_embedder(jnp.zeros_like(input_tokens) if token_type_ids is None else token_type_ids)
        elif token_type_ids is not None:
            raise ValueError(f"{type(c).__name__}.type_vocab_size=0 has no token types; pass token_type_ids=None.")
        if c.num_languages:
            x = x + self.language_embedder(jnp.zeros_like(input_tokens) if language_ids is None else language_ids)
        elif language_ids is not None:
            raise ValueError(f"{type(c).__name__}.num_languages=0 has no language embedding; pass language_ids=None "
                             "or set num_languages.")
        x = x + broadcast_batch(self.position_embedder(position_ids), len(input_tokens))
        return self.dropout(self.layer_norm(x), deterministic=not enable_dropout)  # [b, s, embed_dim]

    def attend(self, query: Array) -> Array:
        """query [..., embed_dim] -> logits [..., vocab] against the token table (tied output)."""
        return self.token_embedder.attend(query)


class PostLNLayer(nn.Module):
    """Post-LN block: LN(x + attention(x)), then LN(x + mlp(x))."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, mask: AttentionMask, enable_dropout: bool = False) -> Array:
        """x [b, s, embed], mask of [b, 1, s, s] -> [b, s, embed]."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        h = MultiHeadAttention(
            c.num_heads, c.head_dim, c.attention_dropout_rate, use_bias=True, scale_logits=True,
            attention_kernel=c.attention_kernel, performer_features=c.performer_features,
            attention_pattern=c.attention_pattern, name="attention", **dtype_kwargs(c),
        )(x, x, mask, enable_dropout)
        x = LayerNorm(c.layer_norm_epsilon, name="attention_layer_norm", **dtype_kwargs(c))(
            x + drop(h, deterministic=not enable_dropout)
        )
        h = MlpBlock(c.d_ff, (c.activation,), 0.0, use_bias=True, name="mlp", **dtype_kwargs(c))(x, enable_dropout)
        x = LayerNorm(c.layer_norm_epsilon, name="mlp_layer_norm", **dtype_kwargs(c))(
            x + drop(h, deterministic=not enable_dropout)
        )
        x = nn.with_logical_constraint(x, HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


class PostLNEncoder(nn.Module):
    """The backbone; `encode` gives the final hidden states.

    shared_embeddings: an `Embeddings` owned by a parent module, used instead of
    an own one (ELECTRA's generator and discriminator share theirs).
    With `num_layer_groups`, layer i uses parameter set `layers_{i * groups // num_layers}`:
    each set serves num_layers // groups consecutive layers.
    """

    config: EncoderConfig
    shared_embeddings: Embeddings | None = None

    def setup(self) -> None:
        c = self.config
        self.embeddings = Embeddings(c) if self.shared_embeddings is None else self.shared_embeddings
        if c.embedding_size is not None:
            self.embedding_projection = Dense((c.d_model,), ("mlp", "embed"), use_bias=True, **dtype_kwargs(c))

    @nn.compact
    def encode(
        self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False,
        attention: Array | None = None, positions: Array | None = None, language_ids: Array | None = None,
    ) -> Array:
        """input_tokens [b, s] int, token_type_ids [b, s] (default 0) -> final hidden states [b, s, d_model].

        attention: bool [b, 1, s, s], the keys each query may attend (UniLM's masks); None: every real token.
        positions [b, s]: each token's position, 0 first (XLM's restart at a pair's second half); None: 0, 1, ...
        language_ids [b, s]: XLM's language of each token (needs `num_languages`).
        """
        c = self.config
        if input_tokens.ndim != 2 or not jnp.issubdtype(input_tokens.dtype, jnp.integer):
            raise ValueError(
                f"input_tokens must be int [batch, length], got {input_tokens.dtype} {input_tokens.shape}."
            )
        if token_type_ids is not None and token_type_ids.shape != input_tokens.shape:
            raise ValueError(
                f"token_type_ids has shape {token_type_ids.shape} but input_tokens has {input_tokens.shape}."
            )
        check_length(input_tokens.shape[1], c.max_sequence_length, type(self).__name__)
        x = self.embedded(input_tokens, token_type_ids, enable_dropout, positions, language_ids)
        mask = (self.attention_mask(input_tokens, x.dtype) if attention is None
                else AttentionMask(mask_to_bias(attention, x.dtype)).for_kernel(c.attention_kernel, x.dtype))
        return apply_layers(
            PostLNLayer, c, c.layer_groups, x, mask, enable_dropout=enable_dropout,
            repeats=c.num_layers // c.layer_groups,
        )

    def embedded(
        self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False,
        positions: Array | None = None, language_ids: Array | None = None,
    ) -> Array:
        """The first layer's input [b, s, d_model]: the embeddings, then ALBERT's and ELECTRA's projection."""
        x = self.embeddings(input_tokens, token_type_ids, enable_dropout, self.position_ids(input_tokens, positions),
                            language_ids)  # [b, s, embed_dim]
        if self.config.embedding_size is not None:
            x = self.embedding_projection(x)  # [b, s, d_model]
        return nn.with_logical_constraint(x, HIDDEN_AXES)

    def position_ids(self, input_tokens: Array, positions: Array | None) -> Array | None:
        """Rows of the position table for `positions` counted from 0: RoBERTa's shifted past pad_token_id (its
        padding keeps pad_token_id); None: the config's own positions."""
        c = self.config
        if positions is None or not c.positions_after_padding:
            return positions
        return jnp.where(input_tokens != c.pad_token_id, positions + c.pad_token_id + 1, c.pad_token_id)

    def attention_mask(self, input_tokens: Array, dtype: jnp.dtype) -> AttentionMask:
        """Every layer's attention mask: real tokens attend to real tokens, in the config's kernel's form."""
        c = self.config
        return encoder_attention_mask(input_tokens, pad_token_id=c.pad_token_id).for_kernel(c.attention_kernel, dtype)


@flax.struct.dataclass
class MaskedLMOutput:
    """mlm_logits float32 [b, s, vocab]; sentence_pair_logits float32 [b, 2]: BERT's next-sentence or ALBERT's
    sentence-order head (None without it)."""

    mlm_logits: Array
    sentence_pair_logits: Array | None


class MaskedLMEncoder(PostLNEncoder):
    """The encoder with its MLM head (tied to the token table) and, if `config.pair_head`, a sentence-pair head.

    `__call__(input_tokens, token_type_ids=None, enable_dropout=False, positions=None, language_ids=None)`
    -> MaskedLMOutput.
    """

    def setup(self) -> None:
        super().setup()
        c = self.config
        self.mlm_head = MlmHead(c.vocab_size, c.embed_dim, c.mlm_activation, c.layer_norm_epsilon, **dtype_kwargs(c))
        if c.pair_head:
            self.pair_head = SentencePairHead(c.d_model, c.pair_dropout_rate, **dtype_kwargs(c))

    def pretraining_logits(
        self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False,
        positions: Array | None = None, language_ids: Array | None = None,
    ) -> tuple[Array, Array | None]:
        """-> float32 (MLM logits [b, s, vocab], sentence-pair logits [b, 2] or None without that head)."""
        hidden = self.encode(input_tokens, token_type_ids, enable_dropout, positions=positions,
                             language_ids=language_ids)
        pair = self.pair_logits(hidden, enable_dropout) if self.config.pair_head else None
        return self.mlm_logits(hidden), pair

    def __call__(
        self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False,
        positions: Array | None = None, language_ids: Array | None = None,
    ) -> MaskedLMOutput:
        """positions, language_ids [b, s]: XLM's translation-LM features (`PostLNEncoder.encode`)."""
        return MaskedLMOutput(*self.pretraining_logits(input_tokens, token_type_ids, enable_dropout, positions,
                                                       language_ids))

    def mlm_logits(self, hidden: Array) -> Array:
        """hidden [b, s, d_model] -> float32 MLM logits [b, s, vocab]."""
        return self.mlm_head(hidden, self.embeddings.attend)

    def pooled(self, hidden: Array) -> Array:
        """hidden [b, s, d_model] -> tanh(dense(hidden[:, 0])) [b, d_model]; needs the sentence-pair head."""
        self._require_pair_head()
        return self.pair_head.pooled(hidden)

    def pair_logits(self, hidden: Array, enable_dropout: bool = False) -> Array:
        """hidden [b, s, d_model] -> float32 sentence-pair logits [b, 2]; needs the sentence-pair head."""
        self._require_pair_head()
        return self.pair_head(hidden, enable_dropout)

    def _require_pair_head(self) -> None:
        if not self.config.pair_head:
            raise ValueError(
                f"this {type(self).__name__} has no pooler or sentence-pair head; its {type(self.config).__name__} "
                "turns the head off (nsp_head / sop_head)."
            )
