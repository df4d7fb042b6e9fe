"""Pre-training heads of the post-LN encoders, each a small module reading hidden states [b, s, d_model].

- `MlmHead`: dense d_model -> E, activation, LayerNorm, logits against the tied
  token table (width E) plus a bias (BERT, RoBERTa, ALBERT, ELECTRA's generator).
- `SentencePairHead`: tanh pooler on the first token, then a 2-way classifier
  (BERT's next-sentence prediction, ALBERT's sentence-order prediction).
- `DiscriminatorHead`: dense d_model -> d_model, activation, dense -> 1
  (ELECTRA's replaced-token detection).
All logits are float32.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType
from ptmjax.layers.dense import Dense
from ptmjax.layers.mlp import ACTIVATIONS
from ptmjax.layers.norms import LayerNorm

Array = jax.Array

LOGIT_AXES = ("activation_batch", "activation_length", "activation_vocab")


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
        h = Dense((self.embed_dim,), ("embed", "mlp"), use_bias=True, name="transform", **kw)(hidden)
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
        return jnp.tanh(self.pooler(hidden[:, 0]))

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
        h = ACTIVATIONS[self.activation](Dense((self.d_model,), ("embed", "mlp"), name="dense", **kw)(hidden))
        logits = Dense((1,), ("mlp", "classes"), name="prediction", **kw)(h)[..., 0]  # [b, s]
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES[:2])
