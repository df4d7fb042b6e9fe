"""BERT and RoBERTa: one post-LN encoder with learned positions, token types, an MLM head and an NSP head.

RoBERTa is this encoder with `positions_after_padding=True` (positions count
non-padding tokens from pad_token_id + 1, as Hugging Face computes them),
pad_token_id=1 and `nsp_head=False` (no pooler, no next-sentence head).

Interface: `__call__(input_tokens, token_type_ids=None, enable_dropout=False)`
-> `BertOutput(mlm_logits [b, s, vocab], nsp_logits [b, 2] or None)`, both
float32; `encode(...)` -> final hidden states [b, s, embed]. The attention
mask comes from `input_tokens != pad_token_id`. Token types are called
`token_type_ids` (not segment ids) because segment ids mean packing in ptmjax.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import gin
import jax
import jax.numpy as jnp

from ptmjax.models.attention import MultiHeadAttention, mask_to_bias, pairwise_mask
from ptmjax.models.config_checks import check_common, check_heads_divide, check_positive_ints
from ptmjax.models.layers import Dense, Embed
from ptmjax.models.mlp import ACTIVATIONS, MlpBlock
from ptmjax.models.norms import LayerNorm
from ptmjax.models.positions import check_length, position_embedder, positions_after_padding, sequential_positions
from ptmjax.models.t5 import dtype_kwargs

Array = jax.Array

HIDDEN_AXES = ("activation_batch", "activation_length", "activation_embed")
LOGIT_AXES = ("activation_batch", "activation_length", "activation_vocab")
EMBED_INIT_STDDEV = 0.02  # BERT's initializer_range, for the embedding tables


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT or RoBERTa encoder.

    head_dim = d_model // num_heads; max_length is the position table size
    (HF max_position_embeddings; RoBERTa's 514 = 512 + pad_token_id + 1).
    activation: 'gelu_exact' (erf, BERT's 'gelu') or 'gelu' (tanh).
    positions_after_padding: RoBERTa position ids (see module docstring).
    nsp_head: build the tanh pooler on the first token and the next-sentence head.
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
    nsp_head: bool = True
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    activation: str = "gelu_exact"
    layer_norm_epsilon: float = 1e-12
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        check_positive_ints(self, "vocab_size", "d_model", "num_heads", "num_layers", "d_ff", "max_length")
        check_positive_ints(self, "type_vocab_size")
        check_heads_divide(self)
        check_common(self, "dropout_rate", "attention_dropout_rate")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})."
            )
        if self.positions_after_padding and self.max_length <= self.pad_token_id + 1:
            raise ValueError(
                f"BertConfig.max_length={self.max_length} leaves no positions after pad_token_id + 1 = "
                f"{self.pad_token_id + 1}; use max_length = longest sequence + pad_token_id + 1."
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def max_sequence_length(self) -> int:
        """The longest input the position table covers."""
        return self.max_length - (self.pad_token_id + 1 if self.positions_after_padding else 0)


@flax.struct.dataclass
class BertOutput:
    """mlm_logits float32 [b, s, vocab]; nsp_logits float32 [b, 2] (None without the NSP head)."""

    mlm_logits: Array
    nsp_logits: Array | None


class BertLayer(nn.Module):
    """Post-LN block: LN(x + attention(x)), then LN(x + mlp(x))."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, bias: Array, enable_dropout: bool = False) -> Array:
        """x [b, s, embed], bias [b, 1, s, s] -> [b, s, embed]."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        h = MultiHeadAttention(
            c.num_heads, c.head_dim, c.attention_dropout_rate, use_bias=True, scale_logits=True,
            name="attention", **dtype_kwargs(c),
        )(x, x, bias, enable_dropout)  # fmt: skip
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


class Bert(nn.Module):
    """BERT / RoBERTa encoder with its pre-training heads (see the module docstring for the interface)."""

    config: BertConfig

    def setup(self) -> None:
        c = self.config
        table_init = nn.initializers.normal(EMBED_INIT_STDDEV)
        self.token_embedder = Embed(c.vocab_size, c.d_model, embedding_init=table_init, **dtype_kwargs(c))
        self.position_embedder = position_embedder(c.max_length, c.d_model, EMBED_INIT_STDDEV, **dtype_kwargs(c))
        self.token_type_embedder = Embed(
            c.type_vocab_size, c.d_model, axes=("token_type", "embed"), embedding_init=table_init, **dtype_kwargs(c)
        )
        self.embedding_layer_norm = LayerNorm(c.layer_norm_epsilon, **dtype_kwargs(c))
        self.layers = [BertLayer(c) for _ in range(c.num_layers)]
        self.dropout = nn.Dropout(c.dropout_rate)
        # MLM head: dense + activation + LayerNorm, then logits against the token embedding plus a bias.
        self.mlm_transform = Dense((c.d_model,), ("embed", "mlp"), use_bias=True, **dtype_kwargs(c))
        self.mlm_layer_norm = LayerNorm(c.layer_norm_epsilon, **dtype_kwargs(c))
        self.mlm_bias = self.param(
            "mlm_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (c.vocab_size,),
            dtype_kwargs(c)["param_dtype"],
        )  # fmt: skip
        if c.nsp_head:
            self.pooler = Dense((c.d_model,), ("embed", "mlp"), use_bias=True, **dtype_kwargs(c))
            self.nsp = Dense((2,), ("embed", "classes"), use_bias=True, **dtype_kwargs(c))

    def encode(self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False) -> Array:
        """input_tokens [b, s] int, token_type_ids [b, s] (default 0) -> final hidden states [b, s, embed]."""
        c = self.config
        if input_tokens.ndim != 2 or not jnp.issubdtype(input_tokens.dtype, jnp.integer):
            raise ValueError(
                f"input_tokens must be int [batch, length], got {input_tokens.dtype} {input_tokens.shape}."
            )
        if token_type_ids is not None and token_type_ids.shape != input_tokens.shape:
            raise ValueError(
                f"token_type_ids has shape {token_type_ids.shape} but input_tokens has {input_tokens.shape}."
            )
        check_length(input_tokens.shape[1], c.max_sequence_length, "Bert")
        if c.positions_after_padding:
            positions = positions_after_padding(input_tokens, c.pad_token_id)  # [b, s]
        else:
            positions = sequential_positions(input_tokens)  # [1, s]
        types = jnp.zeros_like(input_tokens) if token_type_ids is None else token_type_ids
        x = self.token_embedder(input_tokens) + self.token_type_embedder(types) + self.position_embedder(positions)
        x = self.dropout(self.embedding_layer_norm(x), deterministic=not enable_dropout)
        x = nn.with_logical_constraint(x, HIDDEN_AXES)  # [b, s, embed]
        valid = input_tokens != c.pad_token_id
        bias = mask_to_bias(pairwise_mask(valid, valid), x.dtype)  # [b, 1, s, s]
        for layer in self.layers:
            x = layer(x, bias, enable_dropout)
        return x

    def mlm_logits(self, hidden: Array) -> Array:
        """hidden [b, s, embed] -> float32 MLM logits [b, s, vocab]."""
        h = ACTIVATIONS[self.config.activation](self.mlm_transform(hidden))
        logits = self.token_embedder.attend(self.mlm_layer_norm(h)) + jnp.asarray(self.mlm_bias, h.dtype)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)

    def pooled(self, hidden: Array) -> Array:
        """hidden [b, s, embed] -> tanh(dense(hidden[:, 0])) [b, embed]; needs nsp_head=True."""
        if not self.config.nsp_head:
            raise ValueError("this Bert has no pooler; build it with BertConfig(nsp_head=True).")
        return jnp.tanh(self.pooler(hidden[:, 0]))

    def __call__(
        self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False
    ) -> BertOutput:
        hidden = self.encode(input_tokens, token_type_ids, enable_dropout)
        nsp = self.nsp(self.pooled(hidden)).astype(jnp.float32) if self.config.nsp_head else None
        return BertOutput(mlm_logits=self.mlm_logits(hidden), nsp_logits=nsp)
