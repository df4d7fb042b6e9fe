"""Fine-tuning models on the shared post-LN encoder (BERT, RoBERTa, ALBERT, ELECTRA), as Hugging Face's *For* classes.

Each subclasses `PostLNEncoder`, so the backbone keeps the pre-training
model's parameter paths (`embeddings/...`, `embedding_projection`,
`layers_{i}`) and a pre-trained checkpoint restores into it by path; only
the head is new.

- `EncoderForSequenceClassification`: logits [b, num_labels] from the first
  token; regression when num_labels == 1 (as HF). The head follows the
  config's family (`EncoderConfig.classifier_activation`): BERT and ALBERT
  use the tanh pooler (at `pair_head/pooler`, the pre-training pooler's path),
  dropout and a linear `classifier`; RoBERTa and ELECTRA a dense + tanh / GELU
  + `out_proj` head on the first token (`classifier/dense`, `classifier/out_proj`).
- `EncoderForTokenClassification`: dropout and a linear `classifier` per token -> [b, s, num_labels].
- `EncoderForQuestionAnswering`: `qa_outputs` per token -> start and end logits [b, s] (no dropout, as HF).

classifier_dropout_rate: dropout before the classifier; None takes the
config's default (HF hidden_dropout_prob; ALBERT's classifier_dropout_prob).
Interface: `__call__(input_tokens, token_type_ids=None, enable_dropout=False)`; all logits float32.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers.common import dtype_kwargs
from ptmjax.layers.dense import Dense
from ptmjax.models.encoder import PostLNEncoder
from ptmjax.models.task_heads import CLASS_AXES, FirstTokenClassifier, FirstTokenPooler

Array = jax.Array


def check_num_labels(model: nn.Module, minimum: int = 1) -> None:
    """Raise naming the model unless num_labels >= minimum."""
    if not isinstance(model.num_labels, int) or model.num_labels < minimum:
        raise ValueError(f"{type(model).__name__}.num_labels={model.num_labels!r}; use an int >= {minimum}.")


class EncoderTaskModel(PostLNEncoder):
    """The backbone with the fields every fine-tuning head shares."""

    num_labels: int = 2
    classifier_dropout_rate: float | None = None

    @property
    def head_dropout_rate(self) -> float:
        rate = self.classifier_dropout_rate
        return self.config.classifier_dropout_rate_default if rate is None else rate


class EncoderForSequenceClassification(EncoderTaskModel):
    """input_tokens [b, s] -> float32 logits [b, num_labels] (scores when num_labels == 1)."""

    def setup(self) -> None:
        super().setup()
        check_num_labels(self)
        c, kw = self.config, dtype_kwargs(self.config)
        if c.classifier_activation is None:
            self.pair_head = FirstTokenPooler(c.d_model, **kw)
            self.dropout = nn.Dropout(self.head_dropout_rate)
            self.classifier = Dense((self.num_labels,), CLASS_AXES, use_bias=True, **kw)
        else:
            self.classifier = FirstTokenClassifier(
                c.d_model, self.num_labels, c.classifier_activation, self.head_dropout_rate, **kw
            )

    def __call__(self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False) -> Array:
        return self.classify(self.encode(input_tokens, token_type_ids, enable_dropout), enable_dropout)

    def classify(self, hidden: Array, enable_dropout: bool = False) -> Array:
        """The head alone: final hidden states [b, s, d_model] -> float32 logits [b, num_labels]."""
        if self.config.classifier_activation is not None:
            return self.classifier(hidden, enable_dropout)
        pooled = self.dropout(self.pair_head(hidden), deterministic=not enable_dropout)
        return self.classifier(pooled).astype(jnp.float32)


class EncoderForTokenClassification(EncoderTaskModel):
    """input_tokens [b, s] -> float32 logits [b, s, num_labels]."""

    def setup(self) -> None:
        super().setup()
        check_num_labels(self)
        self.dropout = nn.Dropout(self.head_dropout_rate)
        self.classifier = Dense((self.num_labels,), CLASS_AXES, use_bias=True, **dtype_kwargs(self.config))

    def __call__(self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False) -> Array:
        hidden = self.encode(input_tokens, token_type_ids, enable_dropout)
        return self.classifier(self.dropout(hidden, deterministic=not enable_dropout)).astype(jnp.float32)


@flax.struct.dataclass
class SpanLogits:
    """start_logits, end_logits: float32 [b, s], one per input token."""

    start_logits: Array
    end_logits: Array


class EncoderForQuestionAnswering(PostLNEncoder):
    """input_tokens [b, s] -> SpanLogits (start and end logits of the answer span per token)."""

    def setup(self) -> None:
        super().setup()
        self.qa_outputs = Dense((2,), CLASS_AXES, use_bias=True, **dtype_kwargs(self.config))

    def __call__(
        self, input_tokens: Array, token_type_ids: Array | None = None, enable_dropout: bool = False
    ) -> SpanLogits:
        logits = self.qa_outputs(self.encode(input_tokens, token_type_ids, enable_dropout)).astype(jnp.float32)
        return SpanLogits(logits[..., 0], logits[..., 1])
