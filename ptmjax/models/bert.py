"""BERT and RoBERTa: the shared post-LN encoder (ptmjax/models/encoder.py) with an MLM head and an NSP head.

RoBERTa is this encoder with `positions_after_padding=True` (positions count
non-padding tokens from pad_token_id + 1, as Hugging Face computes them),
pad_token_id=1 and `nsp_head=False` (no pooler, no next-sentence head); its
MLM head always uses erf GELU, as Hugging Face's does.

Interface: `__call__(input_tokens, token_type_ids=None, enable_dropout=False)`
-> `MaskedLMOutput(mlm_logits [b, s, vocab], sentence_pair_logits [b, 2]: NSP, or None)`, both
float32; `encode(...)` -> final hidden states [b, s, embed]. The attention
mask comes from `input_tokens != pad_token_id`.
"""

from __future__ import annotations

import dataclasses

import gin

from ptmjax.models.encoder import EncoderConfig, MaskedLMEncoder


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BertConfig(EncoderConfig):
    """Hyper-parameters of a BERT or RoBERTa encoder (fields of `EncoderConfig`, plus the head switch).

    nsp_head: build the tanh pooler on the first token and the next-sentence head.
    hf_model_type: 'xlm-roberta' for XLM-R (RoBERTa over a 250k-piece multilingual vocabulary), which
      Hugging Face exports as XLMRobertaForMaskedLM; None: BERT or RoBERTa. It changes nothing computed.
    """

    nsp_head: bool = True
    hf_model_type: str | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hf_model_type not in (None, "xlm-roberta"):
            raise ValueError(f"BertConfig.hf_model_type={self.hf_model_type!r} is unknown; use None (BERT, "
                             "RoBERTa) or 'xlm-roberta'.")
        if self.hf_model_type == "xlm-roberta" and not self.positions_after_padding:
            raise ValueError("BertConfig.hf_model_type='xlm-roberta' is RoBERTa's architecture: set "
                             "positions_after_padding=True.")

    @property
    def pair_head(self) -> bool:
        return self.nsp_head

    @property
    def mlm_activation(self) -> str:
        """RoBERTa's LM head (HF RobertaLMHead) applies erf GELU whatever the encoder's activation."""
        return "gelu_exact" if self.positions_after_padding else self.activation

    @property
    def classifier_activation(self) -> str | None:
        """RoBERTa classifies with HF RobertaClassificationHead (tanh, no pooler); BERT with its pooler."""
        return "tanh" if self.positions_after_padding else None


class Bert(MaskedLMEncoder):
    """BERT / RoBERTa encoder with its pre-training heads (see the module docstring for the interface)."""

    config: BertConfig
