"""ALBERT: the shared post-LN encoder with a factorized embedding, cross-layer sharing, MLM and SOP heads.

ALBERT ("A Lite BERT") differs from BERT in its parameters only: embedding
tables of width E = embedding_size < d_model with a learned projection
E -> d_model, one set of layer parameters shared by all layers
(num_layer_groups=1), an MLM head that maps d_model -> E before the tied
logits, and a sentence-order (SOP) head with the NSP head's shape.

Interface: `__call__(input_tokens, token_type_ids=None, enable_dropout=False)`
-> `MaskedLMOutput(mlm_logits [b, s, vocab], sentence_pair_logits [b, 2]: SOP, or None)`, both
float32; `encode(...)` -> final hidden states [b, s, d_model].
Hugging Face's AlbertLayer drops its own FFN-output dropout; this keeps it,
as the original ALBERT does (ALBERT v2 trains without dropout anyway).
"""

from __future__ import annotations

import dataclasses

import gin

from ptmjax.models.config import check_rates
from ptmjax.models.encoder import EncoderConfig, MaskedLMEncoder


@gin.configurable
@dataclasses.dataclass(frozen=True)
class AlbertConfig(EncoderConfig):
    """Hyper-parameters of an ALBERT encoder: `EncoderConfig` with ALBERT's defaults (HF AlbertConfig's).

    embedding_size: width E of the embedding tables (always projected to d_model).
    num_layer_groups: 1 shares one set of layer parameters across all layers.
    sop_head: build the tanh pooler and the sentence-order prediction head.
    classifier_dropout_rate: dropout on the pooled output before the SOP classifier.
    """

    embedding_size: int | None = 128
    num_layer_groups: int | None = 1
    dropout_rate: float = dataclasses.field(default=0.0, kw_only=True)
    attention_dropout_rate: float = 0.0
    activation: str = "gelu"
    sop_head: bool = True
    classifier_dropout_rate: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_rates(self, "classifier_dropout_rate")

    @property
    def pair_head(self) -> bool:
        return self.sop_head

    @property
    def pair_dropout_rate(self) -> float:
        return self.classifier_dropout_rate

    @property
    def classifier_dropout_rate_default(self) -> float:
        return self.classifier_dropout_rate  # HF ALBERT's fine-tuning heads use classifier_dropout_prob


class Albert(MaskedLMEncoder):
    """ALBERT with its pre-training heads (see the module docstring for the interface)."""

    config: AlbertConfig
