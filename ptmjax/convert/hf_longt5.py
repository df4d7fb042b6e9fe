"""Hugging Face LongT5 (LongT5ForConditionalGeneration) <-> ptmjax LongT5: configs and state dicts.

T5's mapping (ptmjax/convert/hf_t5.py) with the encoder's attention renamed: HF's
`LocalSelfAttention` / `TransientGlobalSelfAttention` hold q, k, v, o as T5's `SelfAttention`;
TGlobal adds `global_input_layer_norm` in every layer and `global_relative_attention_bias` in block 0
(kept once per stack here, `encoder/global_relpos_bias`). The output layer follows T5's rule
(transformers 5: `scale_decoder_outputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from ptmjax.convert import hf_t5
from ptmjax.convert.hf_heads import BaseModel, Head
from ptmjax.convert.state_dict import Params, field
from ptmjax.models.longt5 import ENCODER_ATTENTION_TYPES, LongT5, LongT5Config

HEADS = {"longt5": {"LongT5ForConditionalGeneration": Head(LongT5)}}
BASE_MODELS = {"LongT5Model": BaseModel("LongT5ForConditionalGeneration", "")}
HF_ATTENTION = {"local": "LocalSelfAttention", "transient-global": "TransientGlobalSelfAttention"}


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> LongT5Config:
    """transformers.LongT5Config (or its config.json dict) -> LongT5Config."""
    model_type = field(hf_config, "model_type", "longt5")
    if model_type != "longt5":
        raise ValueError(f"Hugging Face model_type={model_type!r} is not LongT5; convert it with hf_t5.")
    attention = field(hf_config, "encoder_attention_type", "local")
    if attention not in ENCODER_ATTENTION_TYPES:
        raise ValueError(f"unsupported Hugging Face LongT5 encoder_attention_type={attention!r}; supported: "
                         f"{list(ENCODER_ATTENTION_TYPES)}.")
    as_dict = dict(hf_config) if isinstance(hf_config, Mapping) else hf_config.to_dict()
    t5 = hf_t5.from_hf_config({**as_dict, "model_type": "t5"}, dtype=dtype, param_dtype=param_dtype)
    return LongT5Config(
        **{f.name: getattr(t5, f.name) for f in dataclasses.fields(t5)}, encoder_attention_type=attention,
        local_radius=field(hf_config, "local_radius", 127), global_block_size=field(hf_config, "global_block_size", 16),
    )


def to_hf_config(config: LongT5Config) -> Any:
    """LongT5Config -> transformers.LongT5Config (needs transformers installed)."""
    import transformers

    return transformers.LongT5Config(
        **hf_t5.hf_config_fields(config), encoder_attention_type=config.encoder_attention_type,
        local_radius=config.local_radius, global_block_size=config.global_block_size,
    )


def build_hf_model(config: LongT5Config) -> Any:
    """A randomly initialised transformers LongT5ForConditionalGeneration with the architecture of `config`."""
    import transformers

    return hf_t5.untied(transformers.LongT5ForConditionalGeneration(to_hf_config(config)), config)


def _rules(config: LongT5Config) -> list[hf_t5.Rule]:
    """T5's rules with the encoder's attention named as HF's LongT5, plus TGlobal's parameters."""
    name = HF_ATTENTION[config.encoder_attention_type]
    rules = [
        (key.replace(".layer.0.SelfAttention.", f".layer.0.{name}.") if key.startswith("encoder.") else key, *rest)
        for key, *rest in hf_t5.t5_rules(config)
    ]
    if config.encoder_attention_type == "transient-global":
        ident = (lambda w: w, lambda w: w)
        rules.append((f"encoder.block.0.layer.0.{name}.global_relative_attention_bias.weight",
                      ("encoder", "global_relpos_bias", "rel_embedding"), *ident))
        rules += [
            (f"encoder.block.{i}.layer.0.{name}.global_input_layer_norm.weight",
             ("encoder", f"layers_{i}", "attention", "global_input_layer_norm", "scale"), *ident)
            for i in range(config.num_encoder_layers)
        ]
    return rules


def hf_to_params(state_dict: Mapping[str, Any], config: LongT5Config) -> Params:
    """HF LongT5ForConditionalGeneration state dict -> ptmjax params tree (numpy arrays); KeyError names
    missing and unexpected keys."""
    return hf_t5.state_to_params(state_dict, config, _rules(config))


def params_to_hf(params: Params, config: LongT5Config) -> dict[str, np.ndarray]:
    """ptmjax LongT5 params (boxed or not) -> HF state dict of numpy arrays, tied copies included."""
    return hf_t5.params_to_state(params, config, _rules(config))
