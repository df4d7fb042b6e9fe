"""Hugging Face ALBERT <-> ptmjax: configs and state dicts (weights as numpy arrays).

ALBERT with the SOP head <-> AlbertForPreTraining, without it <-> AlbertForMaskedLM.
HF keeps one parameter set per layer group (`albert_layer_groups.{g}`), each
holding `inner_group_num` layers; ptmjax supports inner_group_num = 1, so group g
is `layers_{g}`. The MLM decoder weight is tied to the word embedding and its
bias to `predictions.bias`. Tensor layouts: see hf_encoder.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptmjax.convert.hf_encoder import (
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
from ptmjax.models.albert import Albert, AlbertConfig

HEADS = {"albert": {
    "AlbertForPreTraining": Head(Albert, {"sop_head": True}), "AlbertForMaskedLM": Head(Albert, {"sop_head": False}),
}}
BASE_MODELS = {"AlbertModel": BaseModel("AlbertForPreTraining", "albert.")}

LAYOUT = HFLayout(
    embeddings="albert.embeddings", layer="albert.encoder.albert_layer_groups.{}.albert_layers.0",
    query="attention.query", key="attention.key", value="attention.value", attention_out="attention.dense",
    attention_norm="attention.LayerNorm", ffn_in="ffn", ffn_out="ffn_output", ffn_norm="full_layer_layer_norm",
    projection="albert.encoder.embedding_hidden_mapping_in",
)
TIED = {
    "predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
    "predictions.decoder.bias": "predictions.bias",
}


def from_hf_config(
    hf_config: Any, sop_head: bool = True, dtype: str = "float32", param_dtype: str = "float32"
) -> AlbertConfig:
    """transformers.AlbertConfig (or a config.json dict) -> AlbertConfig; unsupported values raise naming the field.

    sop_head: True for AlbertForPreTraining, False for AlbertForMaskedLM.
    """
    require(hf_config, "ALBERT", "model_type", ["albert"], "albert")
    require(hf_config, "ALBERT", "inner_group_num", [1], 1)
    fields = encoder_fields(hf_config, "ALBERT")
    groups = field(hf_config, "num_hidden_groups", 1)
    if not isinstance(groups, int) or groups < 1 or fields["num_layers"] % groups:
        raise ValueError(
            f"unsupported Hugging Face ALBERT num_hidden_groups={groups!r}; ptmjax supports a positive divisor of "
            f"num_hidden_layers={fields['num_layers']}."
        )
    num_labels = len(field(hf_config, "id2label", None) or range(2))
    if sop_head and num_labels != 2:
        raise ValueError(f"unsupported Hugging Face ALBERT num_labels={num_labels}; the SOP head is 2-way.")
    return AlbertConfig(
        **fields,
        pad_token_id=field(hf_config, "pad_token_id", 0),
        embedding_size=field(hf_config, "embedding_size", 128),
        num_layer_groups=groups,
        sop_head=sop_head,
        classifier_dropout_rate=float(field(hf_config, "classifier_dropout_prob", 0.1)),
        dtype=dtype,
        param_dtype=param_dtype,
    )


def to_hf_config(config: AlbertConfig) -> Any:
    """AlbertConfig -> transformers.AlbertConfig (needs transformers installed)."""
    import transformers

    refuse_unless(config, "ALBERT", positions_after_padding=(False,))
    if config.embedding_size is None:
        raise ValueError("AlbertConfig.embedding_size=None has no Hugging Face ALBERT equivalent (ALBERT always "
                         "projects its embeddings); set embedding_size, e.g. to d_model.")
    return transformers.AlbertConfig(
        **hf_encoder_kwargs(config), embedding_size=config.embedding_size, num_hidden_groups=config.layer_groups,
        inner_group_num=1, classifier_dropout_prob=config.classifier_dropout_rate,
    )


def hf_class_name(config: AlbertConfig) -> str:
    """The transformers class holding exactly this model's parameters."""
    return "AlbertForPreTraining" if config.sop_head else "AlbertForMaskedLM"


def build_hf_model(config: AlbertConfig) -> Any:
    """A randomly initialised transformers model of `config` (works under `torch.device('meta')`)."""
    import transformers

    return getattr(transformers, hf_class_name(config))(to_hf_config(config))


def _rules(config: AlbertConfig) -> list[Rule]:
    rules = backbone_rules(config, LAYOUT) + mlm_head_rules("predictions.dense", "predictions.LayerNorm",
                                                            "predictions.bias")
    if config.sop_head:
        rules += pair_head_rules("albert.pooler", "sop_classifier.classifier")
    return rules


def hf_to_params(state_dict: dict[str, Any], config: AlbertConfig) -> Params:
    """HF state dict (class per `hf_class_name`) -> {'params': tree} of numpy arrays."""
    return state_to_params(state_dict, _rules(config), TIED, LAYOUT, str(config))


def params_to_hf(params: Params, config: AlbertConfig) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of the HF model's `state_dict()`, tied copies included."""
    return params_to_state(params, _rules(config), TIED, str(config))
