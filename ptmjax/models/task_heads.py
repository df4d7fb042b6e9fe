"""Fine-tuning heads on final hidden states [b, s, d_model], shaped and named as Hugging Face's.

- `FirstTokenPooler`: tanh(dense(hidden[:, 0])), BERT's and ALBERT's pooler. Its
  dense layer is called `pooler` and the module sits at `pair_head` in a model,
  the path of the pre-training `SentencePairHead`'s pooler, so a pre-trained
  pooler restores by path and converts with the same Hugging Face rule.
- `FirstTokenClassifier`: RoBERTa's and ELECTRA's classification head: dropout,
  dense, activation (RoBERTa tanh, ELECTRA erf GELU), dropout, `out_proj`.
All logits are float32.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DType
from ptmjax.layers.dense import Dense
from ptmjax.layers.mlp import ACTIVATIONS

Array = jax.Array

HEAD_ACTIVATIONS = {"tanh": jnp.tanh, "gelu_exact": ACTIVATIONS["gelu_exact"]}
CLASS_AXES = ("embed", "classes")


class FirstTokenPooler(nn.Module):
    """hidden [b, s, d_model] -> tanh(dense(hidden[:, 0])) [b, d_model]."""

    d_model: int
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    def setup(self) -> None:
        self.pooler = Dense(
            (self.d_model,), ("embed", "mlp"), use_bias=True, dtype=self.dtype, param_dtype=self.param_dtype
        )

    def __call__(self, hidden: Array) -> Array:
        return jnp.tanh(self.pooler(hidden[:, 0]))


class FirstTokenClassifier(nn.Module):
    """hidden [b, s, d_model] -> float32 logits [b, num_labels] from the first token (RoBERTa, ELECTRA)."""

    d_model: int
    num_labels: int
    activation: str
    dropout_rate: float
    dtype: DType = jnp.float32
    param_dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, hidden: Array, enable_dropout: bool = False) -> Array:
        if self.activation not in HEAD_ACTIVATIONS:
            raise ValueError(
                f"FirstTokenClassifier.activation={self.activation!r} is unknown; "
                f"use one of {sorted(HEAD_ACTIVATIONS)}."
            )
        kw = {"use_bias": True, "dtype": self.dtype, "param_dtype": self.param_dtype}
        drop = nn.Dropout(self.dropout_rate, deterministic=not enable_dropout)
        x = Dense((self.d_model,), ("embed", "mlp"), name="dense", **kw)(drop(hidden[:, 0]))
        x = drop(HEAD_ACTIVATIONS[self.activation](x))
        return Dense((self.num_labels,), ("mlp", "classes"), name="out_proj", **kw)(x).astype(jnp.float32)
