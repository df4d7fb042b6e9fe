"""GPT-2 sequence classification, as Hugging Face's GPT2ForSequenceClassification.

A bias-free `score` layer maps every final hidden state to num_labels
logits; a row's logits are those of its last token that is not
`pad_token_id` (the rightmost such token, as HF; a row of padding only uses
position 0). The backbone is `GPT2` itself, so its parameter paths are the
pre-trained model's. Rows are right-padded: causal attention keeps a real
token from seeing the padding after it, so no padding mask is needed.
A regression when num_labels == 1 (as HF).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ptmjax.layers.common import dtype_kwargs
from ptmjax.layers.dense import Dense
from ptmjax.models.encoder_tasks import check_num_labels
from ptmjax.models.gpt2 import GPT2
from ptmjax.models.task_heads import CLASS_AXES

Array = jax.Array


def last_real_token(input_tokens: Array, pad_token_id: int) -> Array:
    """int32 [b]: the index of each row's rightmost token that is not `pad_token_id` (0 if none)."""
    positions = jnp.arange(input_tokens.shape[1], dtype=jnp.int32)
    return jnp.argmax(positions * (input_tokens != pad_token_id), axis=-1).astype(jnp.int32)


class GPT2ForSequenceClassification(GPT2):
    """input_tokens [b, t] (right-padded with pad_token_id) -> float32 logits [b, num_labels]."""

    num_labels: int = 2
    pad_token_id: int = 0

    def setup(self) -> None:
        super().setup()
        check_num_labels(self)
        if not 0 <= self.pad_token_id < self.config.vocab_size:
            raise ValueError(
                f"GPT2ForSequenceClassification.pad_token_id={self.pad_token_id} is outside the vocabulary "
                f"[0, {self.config.vocab_size}); use the id the inputs are padded with."
            )
        self.score = Dense((self.num_labels,), CLASS_AXES, **dtype_kwargs(self.config))

    def __call__(self, input_tokens: Array, enable_dropout: bool = False) -> Array:  # type: ignore[override]
        hidden = self.hidden_states(input_tokens, enable_dropout=enable_dropout)  # [b, t, d_model]
        last = last_real_token(input_tokens, self.pad_token_id)
        pooled = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [b, d_model]
        return self.score(pooled).astype(jnp.float32)
