"""Pre-training heads of the post-LN encoders, each a small module reading hidden states [b, s, d_model].

- `MlmHead`: dense d_model -> E, activation, LayerNorm, logits against the tied
  token table (width E) plus a bias (BERT, RoBERTa, ALBERT, ELECTRA's generator).
- `SentencePairHead`: tanh pooler on the first token, then a 2-way classifier
  (BERT's next-sentence prediction, ALBERT's sentence-order prediction).
- `DiscriminatorHead`: dense d_model -> d_model, activation, dense -> 1
  (ELECTRA's replaced-token detection).
- `SpanBoundaryHead`: SpanBERT's span boundary objective, from the states at
  a span's two boundary tokens and a relative position embedding.
All logits are float32.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import HIDDEN_AXES, DType
from ptmjax.layers.dense import Dense
from ptmjax.layers.embed import EMBED_INIT_STDDEV, Embed
from ptmjax.layers.mlp import ACTIVATIONS
from ptmjax.layers.norms import LayerNorm

Array = jax.Array

LOGIT_AXES = ("activation_batch", "activation_length", "activation_vocab")


def in_activation_layout(hidden: Array) -> Array:
    """`hidden` [b, s, d] or [b, d] pinned to the activations' layout (`HIDDEN_AXES`). A head's hidden activation
    between two kernels sharded on ('embed', 'mlp'), left to XLA's propagation, got wrong gradients on (data, fsdp,
    tensor) meshes at widths of 64 and more (XLA SPMD, jax 0.10.2; tests/training/test_encoder_training.py)."""
    axes = HIDDEN_AXES if hidden.ndim == 3 else (HIDDEN_AXES[0], HIDDEN_AXES[2])
    return nn.with_logical_constraint(hidden, axes)


class MlmHead(nn.Module):
    """hidden [b, s, d_model] -> MLM logits [b, s, vocab]; `attend` maps [..., E] to logits on the token table."""

    vocab_size: int
    embed_dim: int
    activation: str
    layer_norm_epsilon: float
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, hidden: Array, attend: Callable[[Array], Array]) -> Array:
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        transform = Dense((self.embed_dim,), ("embed", "mlp"), use_bias=True, name="transform", **kw)
        h = in_activation_layout(transform(hidden))
        h = LayerNorm(self.layer_norm_epsilon, name="layer_norm", **kw)(ACTIVATIONS[self.activation](h))  # [b, s, E]
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (self.vocab_size,),
            self.param_dtype,
        )
        logits = attend(h) + jnp.asarray(bias, self.dtype)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)


class SentencePairHead(nn.Module):
    """Tanh pooler on the first token, dropout, then 2-way logits: hidden [b, s, d_model] -> [b, 2]."""

    d_model: int
    dropout_rate: float = 0.0
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    def setup(self) -> None:
        kw = {"use_bias": True, "dtype": self.dtype, "param_dtype": self.param_dtype}
        self.pooler = Dense((self.d_model,), ("embed", "mlp"), **kw)
        self.classifier = Dense((2,), ("embed", "classes"), **kw)
        self.dropout = nn.Dropout(self.dropout_rate)

    def pooled(self, hidden: Array) -> Array:
        """hidden [b, s, d_model] -> tanh(dense(hidden[:, 0])) [b, d_model]."""
        return jnp.tanh(in_activation_layout(self.pooler(hidden[:, 0])))

    def __call__(self, hidden: Array, enable_dropout: bool = False) -> Array:
        pooled = self.dropout(self.pooled(hidden), deterministic=not enable_dropout)
        return self.classifier(pooled).astype(jnp.float32)


class DiscriminatorHead(nn.Module):
    """ELECTRA's replaced-token detection: hidden [b, s, d_model] -> float32 logits [b, s] (one per token)."""

    d_model: int
    activation: str
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, hidden: Array) -> Array:
        kw = {"use_bias": True, "dtype": self.dtype, "param_dtype": self.param_dtype}
        h = in_activation_layout(Dense((self.d_model,), ("embed", "mlp"), name="dense", **kw)(hidden))
        h = ACTIVATIONS[self.activation](h)
        logits = Dense((1,), ("mlp", "classes"), name="prediction", **kw)(h)[..., 0]  # [b, s]
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES[:2])


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective: logits [b, s, vocab] for each position from the hidden states at the
    boundary tokens of its span and the embedding of its position in the span (Joshi et al., 2020, eq. 1-2):

        h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}],  h1 = LN(act(W1 h0 + b1)),  y = LN(act(W2 h1 + b2)),
        logits = attend(y) + bias

    with `attend` the tied token table (the MLM head's output embedding) and a bias of its own, as SpanBERT's code.
    W1 is stored as [3, d_model, d_model]: the left, right and position blocks of the concatenation.
    Relative positions run 1..max_positions (row p - 1 of the position table); other positions (0: no span
    boundary there) read row 0 or the last row and are for the caller to weigh out.
    """

    vocab_size: int
    embed_dim: int
    d_model: int
    max_positions: int
    activation: str
    layer_norm_epsilon: float
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, hidden: Array, left: Array, right: Array, position: Array,
                 attend: Callable[[Array], Array]) -> Array:
        """hidden [b, s, d_model]; left, right [b, s] indices of the boundary tokens; position [b, s] in the span."""
        kw = {"dtype": self.dtype, "param_dtype": self.param_dtype}
        last = hidden.shape[1] - 1
        boundary = [jnp.take_along_axis(hidden, jnp.clip(i, 0, last)[..., None], axis=1) for i in (left, right)]
        table = Embed(self.max_positions, self.d_model, axes=("span_position", "embed"),
                      embedding_init=nn.initializers.normal(EMBED_INIT_STDDEV), name="position_embedder", **kw)
        parts = jnp.stack([*boundary, table(jnp.clip(position - 1, 0, self.max_positions - 1))], axis=-2)
        act = ACTIVATIONS[self.activation]
        h = Dense((self.d_model,), ("span_part", "embed", "mlp"), axis=(-2, -1), use_bias=True, name="dense_1",
                  **kw)(parts)  # [b, s, d_model]
        h = in_activation_layout(h)
        h = LayerNorm(self.layer_norm_epsilon, name="layer_norm_1", **kw)(act(h))
        h = in_activation_layout(Dense((self.embed_dim,), ("mlp", "embed"), use_bias=True, name="dense_2", **kw)(h))
        h = LayerNorm(self.layer_norm_epsilon, name="layer_norm_2", **kw)(act(h))  # [b, s, E]
        bias = self.param(
            "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)), (self.vocab_size,),
            self.param_dtype,
        )
        logits = attend(h) + jnp.asarray(bias, self.dtype)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)
