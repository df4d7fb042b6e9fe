"""Hugging Face MPNet <-> ptmjax: configs and state dicts (weights as numpy arrays).

MPNetForMaskedLM <-> `MPNet` (MPNetModel imports with a fresh MLM head). The backbone is the post-LN
encoder's (tensor layouts: see hf_encoder.py) without token types, plus the relative position bias
`mpnet.encoder.relative_attention_bias` [buckets, heads] <-> `relative_position_bias/rel_embedding`.
The MLM decoder weight is tied to the word embedding and its bias to `lm_head.bias`. Hugging Face pads
with id 1 and counts positions from 2 whatever its config says, and buckets relative positions into 32
up to distance 128: a config that differs is refused. `MPNetPretraining` has MPNet's parameters and is
exported as the `MPNet` it runs (its family record's `parts`).
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
    params_to_state,
    refuse_unless,
    state_to_params,
)
from ptmjax.convert.hf_heads import BaseModel, Head
from ptmjax.convert.state_dict import Params, Rule, one_to_one, require
from ptmjax.models.mpnet import MPNet, MPNetConfig

HEADS = {"mpnet": {"MPNetForMaskedLM": Head(MPNet)}}
BASE_MODELS = {"MPNetModel": BaseModel("MPNetForMaskedLM", "mpnet.")}
HF_PAD_ID, HF_BUCKETS, HF_MAX_DISTANCE = 1, 32, 128

LAYOUT = HFLayout(
    embeddings="mpnet.embeddings", layer="mpnet.encoder.layer.{}",
    query="attention.attn.q", key="attention.attn.k", value="attention.attn.v", attention_out="attention.attn.o",
    attention_norm="attention.LayerNorm", ffn_in="intermediate.dense", ffn_out="output.dense",
    ffn_norm="output.LayerNorm",
)
TIED = {"lm_head.decoder.weight": "mpnet.embeddings.word_embeddings.weight", "lm_head.decoder.bias": "lm_head.bias"}


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> MPNetConfig:
    """transformers.MPNetConfig (or a config.json dict) -> MPNetConfig; unsupported values raise naming the field."""
    require(hf_config, "MPNet", "model_type", ["mpnet"], "mpnet")
    require(hf_config, "MPNet", "relative_attention_num_buckets", [HF_BUCKETS], HF_BUCKETS)
    require(hf_config, "MPNet", "pad_token_id", [HF_PAD_ID, None], HF_PAD_ID)
    fields = {**encoder_fields(hf_config, "MPNet"), "type_vocab_size": 0}
    return MPNetConfig(
        **fields, pad_token_id=HF_PAD_ID, positions_after_padding=True, dtype=dtype, param_dtype=param_dtype
    )


def to_hf_config(config: MPNetConfig) -> Any:
    """MPNetConfig -> transformers.MPNetConfig (needs transformers installed)."""
    import transformers

    refuse_unless(
        config, "MPNet", embedding_size=(None,), num_layer_groups=(None, config.num_layers), type_vocab_size=(0,),
        pad_token_id=(HF_PAD_ID,), positions_after_padding=(True,), relative_attention_num_buckets=(HF_BUCKETS,),
        relative_attention_max_distance=(HF_MAX_DISTANCE,),
    )
    kwargs = hf_encoder_kwargs(config)
    del kwargs["type_vocab_size"]
    return transformers.MPNetConfig(**kwargs, relative_attention_num_buckets=config.relative_attention_num_buckets)


def build_hf_model(config: MPNetConfig) -> Any:
    """A randomly initialised transformers.MPNetForMaskedLM of `config` (works under `torch.device('meta')`)."""
    import transformers

    return transformers.MPNetForMaskedLM(to_hf_config(config))


def _rules(config: MPNetConfig) -> list[Rule]:
    return [
        *backbone_rules(config, LAYOUT),
        one_to_one("mpnet.encoder.relative_attention_bias.weight", ("relative_position_bias", "rel_embedding")),
        *mlm_head_rules("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
    ]


def hf_to_params(state_dict: dict[str, Any], config: MPNetConfig) -> Params:
    """MPNetForMaskedLM state dict -> {'params': tree} of numpy arrays (tied copies and position_ids ignored)."""
    return state_to_params(state_dict, _rules(config), TIED, LAYOUT, str(config))


def params_to_hf(params: Params, config: MPNetConfig) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of MPNetForMaskedLM's `state_dict()`, tied copies included."""
    return params_to_state(params, _rules(config), TIED, str(config))
