"""Hugging Face BERT / RoBERTa <-> ptmjax: configs and state dicts (weights as numpy arrays).

Families and HF classes: BERT with the NSP head <-> BertForPreTraining,
BERT without it <-> BertForMaskedLM, RoBERTa <-> RobertaForMaskedLM.
The MLM decoder weight is tied to the word embedding and its bias to the head's bias.
Tensor layouts: see hf_encoder.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptmjax.convert.hf_encoder import (
    BERT_LAYER_NAMES,
    HFLayout,
    backbone_rules,
    encoder_fields,
    hf_encoder_kwargs,
    mlm_head_rules,
    pair_head_rules,
    params_to_state,
    refuse_unless,
    state_to_params,
)
from ptmjax.convert.hf_heads import BaseModel, Head
from ptmjax.convert.state_dict import Params, Rule, field, require
from ptmjax.models.bert import Bert, BertConfig

HEADS = {
    "bert": {"BertForPreTraining": Head(Bert, {"nsp_head": True}), "BertForMaskedLM": Head(Bert, {"nsp_head": False})},
    "roberta": {"RobertaForMaskedLM": Head(Bert, {"nsp_head": False})},
}
BASE_MODELS = {"BertModel": BaseModel("BertForPreTraining", "bert."),
               "RobertaModel": BaseModel("RobertaForMaskedLM", "roberta.")}

FAMILY_DEFAULTS = {  # model_type -> what the HF family fixes
    "bert": {"positions_after_padding": False, "pad_token_id": 0, "nsp_head": True},
    "roberta": {"positions_after_padding": True, "pad_token_id": 1, "nsp_head": False},
}


def family(config: BertConfig) -> str:
    """'roberta' when positions count from after the padding id, else 'bert'."""
    return "roberta" if config.positions_after_padding else "bert"


def from_hf_config(
    hf_config: Any, nsp_head: bool | None = None, dtype: str = "float32", param_dtype: str = "float32"
) -> BertConfig:
    """transformers.BertConfig / RobertaConfig (or a config.json dict) -> BertConfig.

    nsp_head: None takes the family's pre-training head (BERT: pooler + NSP; RoBERTa: MLM only).
    Unsupported values raise naming the field.
    """
    model_type = require(hf_config, "BERT", "model_type", list(FAMILY_DEFAULTS), "bert")
    fields = encoder_fields(hf_config, "BERT" if model_type == "bert" else "RoBERTa")
    defaults = FAMILY_DEFAULTS[model_type]
    pad = field(hf_config, "pad_token_id", defaults["pad_token_id"])
    return BertConfig(
        **fields,
        pad_token_id=defaults["pad_token_id"] if pad is None else pad,
        positions_after_padding=defaults["positions_after_padding"],
        nsp_head=defaults["nsp_head"] if nsp_head is None else nsp_head,
        dtype=dtype,
        param_dtype=param_dtype,
    )


def to_hf_config(config: BertConfig) -> Any:
    """BertConfig -> transformers.BertConfig or RobertaConfig (needs transformers installed)."""
    import transformers

    refuse_unless(config, "BERT", embedding_size=(None,), num_layer_groups=(None, config.num_layers))
    if family(config) == "roberta":
        return transformers.RobertaConfig(**hf_encoder_kwargs(config))
    return transformers.BertConfig(**hf_encoder_kwargs(config))


def hf_class_name(config: BertConfig) -> str:
    """The transformers class holding exactly this model's parameters."""
    if family(config) == "roberta":
        if config.nsp_head:
            raise ValueError("RoBERTa has no NSP head in transformers; build it with BertConfig(nsp_head=False).")
        return "RobertaForMaskedLM"
    return "BertForPreTraining" if config.nsp_head else "BertForMaskedLM"


def build_hf_model(config: BertConfig) -> Any:
    """A randomly initialised transformers model of `config` (works under `torch.device('meta')`)."""
    import transformers

    return getattr(transformers, hf_class_name(config))(to_hf_config(config))


def layout(config: BertConfig) -> HFLayout:
    """Where BERT (`bert.` keys) or RoBERTa (`roberta.` keys) keeps the backbone."""
    base = family(config)
    return HFLayout(embeddings=f"{base}.embeddings", layer=f"{base}.encoder.layer.{{}}", **BERT_LAYER_NAMES)


def _rules(config: BertConfig) -> list[Rule]:
    rules = backbone_rules(config, layout(config))
    if family(config) == "roberta":
        rules += mlm_head_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
    else:
        rules += mlm_head_rules("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                "cls.predictions.bias")
    if config.nsp_head:
        rules += pair_head_rules(f"{family(config)}.pooler.dense", "cls.seq_relationship")
    return rules


def _tied_keys(config: BertConfig) -> dict[str, str]:
    """HF keys that are tied copies -> the key they copy."""
    base = family(config)
    head = "lm_head" if base == "roberta" else "cls.predictions"
    return {
        f"{head}.decoder.weight": f"{base}.embeddings.word_embeddings.weight",
        f"{head}.decoder.bias": f"{head}.bias",
    }


def hf_to_params(state_dict: dict[str, Any], config: BertConfig) -> Params:
    """HF state dict (class per `hf_class_name`) -> {'params': tree} of numpy arrays.

    Tied copies and the derived buffers embeddings.position_ids / token_type_ids are ignored.
    """
    return state_to_params(state_dict, _rules(config), _tied_keys(config), layout(config), str(config))


def params_to_hf(params: Params, config: BertConfig) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of the HF model's `state_dict()`, tied copies included."""
    return params_to_state(params, _rules(config), _tied_keys(config), str(config))
