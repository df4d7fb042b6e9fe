"""Hugging Face BERT / RoBERTa <-> ptmjax: configs and state dicts (weights as numpy arrays).

Families and HF classes: BERT with the NSP head <-> BertForPreTraining,
BERT without it <-> BertForMaskedLM, RoBERTa <-> RobertaForMaskedLM,
XLM-R <-> XLMRobertaForMaskedLM (RoBERTa's architecture and `roberta.` keys,
kept apart by `hf_model_type='xlm-roberta'`).
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
    "xlm-roberta": {"XLMRobertaForMaskedLM": Head(Bert, {"nsp_head": False})},
}
BASE_MODELS = {"BertModel": BaseModel("BertForPreTraining", "bert."),
               "RobertaModel": BaseModel("RobertaForMaskedLM", "roberta."),
               "XLMRobertaModel": BaseModel("XLMRobertaForMaskedLM", "roberta.")}

FAMILY_DEFAULTS = {  # model_type -> what the HF family fixes
    "bert": {"positions_after_padding": False, "pad_token_id": 0, "nsp_head": True},
    "roberta": {"positions_after_padding": True, "pad_token_id": 1, "nsp_head": False},
    "xlm-roberta": {"positions_after_padding": True, "pad_token_id": 1, "nsp_head": False},
}
HF_NAMES = {  # model_type -> (name in errors, transformers config class, MLM class)
    "bert": ("BERT", "BertConfig", "BertForMaskedLM"),
    "roberta": ("RoBERTa", "RobertaConfig", "RobertaForMaskedLM"),
    "xlm-roberta": ("XLM-R", "XLMRobertaConfig", "XLMRobertaForMaskedLM"),
}


def family(config: BertConfig) -> str:
    """'xlm-roberta' for XLM-R, 'roberta' when positions count from after the padding id, else 'bert'."""
    if config.hf_model_type is not None:
        return config.hf_model_type
    return "roberta" if config.positions_after_padding else "bert"


def _key_prefix(config: BertConfig) -> str:
    """Where transformers keeps the backbone: 'bert', or 'roberta' (RoBERTa and XLM-R)."""
    return "bert" if family(config) == "bert" else "roberta"

def from_hf_config(
    hf_config: Any, nsp_head: bool | None = None, dtype: str = "float32", param_dtype: str = "float32"
) -> BertConfig:
    """transformers.BertConfig / RobertaConfig / XLMRobertaConfig (or a config.json dict) -> BertConfig.

    nsp_head: None takes the family's pre-training head (BERT: pooler + NSP; RoBERTa, XLM-R: MLM only).
    Unsupported values raise naming the field.
    """
    model_type = require(hf_config, "BERT", "model_type", list(FAMILY_DEFAULTS), "bert")
    fields = encoder_fields(hf_config, HF_NAMES[model_type][0])
    defaults = FAMILY_DEFAULTS[model_type]
    pad = field(hf_config, "pad_token_id", defaults["pad_token_id"])
    return BertConfig(
        **fields,
        pad_token_id=defaults["pad_token_id"] if pad is None else pad,
        positions_after_padding=defaults["positions_after_padding"],
        nsp_head=defaults["nsp_head"] if nsp_head is None else nsp_head,
        dtype=dtype,
        param_dtype=param_dtype,
        hf_model_type="xlm-roberta" if model_type == "xlm-roberta" else None,
    )


def to_hf_config(config: BertConfig) -> Any:
    """BertConfig -> transformers.BertConfig, RobertaConfig or XLMRobertaConfig (needs transformers installed)."""
    import transformers

    refuse_unless(config, "BERT", embedding_size=(None,), num_layer_groups=(None, config.num_layers))
    return getattr(transformers, HF_NAMES[family(config)][1])(**hf_encoder_kwargs(config))


def hf_class_name(config: BertConfig) -> str:
    """The transformers class holding exactly this model's parameters."""
    name, _, mlm_class = HF_NAMES[family(config)]
    if family(config) != "bert":
        if config.nsp_head:
            raise ValueError(f"{name} has no NSP head in transformers; build it with BertConfig(nsp_head=False).")
        return mlm_class
    return "BertForPreTraining" if config.nsp_head else mlm_class


def build_hf_model(config: BertConfig) -> Any:
    """A randomly initialised transformers model of `config` (works under `torch.device('meta')`)."""
    import transformers

    return getattr(transformers, hf_class_name(config))(to_hf_config(config))


def layout(config: BertConfig) -> HFLayout:
    """Where BERT (`bert.` keys) or RoBERTa and XLM-R (`roberta.` keys) keep the backbone."""
    base = _key_prefix(config)
    return HFLayout(embeddings=f"{base}.embeddings", layer=f"{base}.encoder.layer.{{}}", **BERT_LAYER_NAMES)


def _rules(config: BertConfig) -> list[Rule]:
    rules = backbone_rules(config, layout(config))
    if family(config) != "bert":
        rules += mlm_head_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.bias")
    else:
        rules += mlm_head_rules("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                "cls.predictions.bias")
    if config.nsp_head:
        rules += pair_head_rules(f"{_key_prefix(config)}.pooler.dense", "cls.seq_relationship")
    return rules


def _tied_keys(config: BertConfig) -> dict[str, str]:
    """HF keys that are tied copies -> the key they copy."""
    base = _key_prefix(config)
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
