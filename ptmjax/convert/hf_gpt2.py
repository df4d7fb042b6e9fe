"""Hugging Face GPT-2 <-> ptmjax: configs and state dicts (weights as numpy arrays).

HF GPT-2 uses Conv1D, whose weights are already [in, out]. The fused
c_attn [E, 3E] splits into query/key/value [E, H, D] (bias [3E] -> [H, D]
each); c_proj [E, E] -> out [H, D, E]. lm_head is tied to wte.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptmjax.convert.hf_heads import BaseModel, Head
from ptmjax.convert.state_dict import (
    Params,
    Rule,
    field,
    one_to_one,
    params_to_rules,
    refuse_attention_pattern,
    require,
    rules_to_params,
)
from ptmjax.models.gpt2 import GPT2, GPT2Config

# HF activation_function -> ours. 'gelu_pytorch_tanh' is the same tanh formula as 'gelu_new'.
HEADS = {"gpt2": {"GPT2LMHeadModel": Head(GPT2)}}
BASE_MODELS = {"GPT2Model": BaseModel("GPT2LMHeadModel", "transformer.")}

ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu", "silu": "silu"}
TO_HF_ACTIVATION = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu", "silu": "silu"}


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> GPT2Config:
    """transformers.GPT2Config (or its config.json dict) -> GPT2Config; unsupported values raise naming the field."""
    require(hf_config, "GPT-2", "model_type", ["gpt2"], "gpt2")
    require(hf_config, "GPT-2", "scale_attn_weights", [True], True)
    require(hf_config, "GPT-2", "scale_attn_by_inverse_layer_idx", [False], False)
    require(hf_config, "GPT-2", "add_cross_attention", [False], False)
    require(hf_config, "GPT-2", "tie_word_embeddings", [True], True)
    activation = require(hf_config, "GPT-2", "activation_function", list(ACTIVATIONS), "gelu_new")
    resid, embd = float(field(hf_config, "resid_pdrop", 0.1)), float(field(hf_config, "embd_pdrop", 0.1))
    if resid != embd:
        raise ValueError(
            f"unsupported Hugging Face GPT-2 resid_pdrop={resid} != embd_pdrop={embd}; ptmjax uses one dropout_rate "
            "for both: set them equal."
        )
    d_model = field(hf_config, "n_embd")
    return GPT2Config(
        vocab_size=field(hf_config, "vocab_size"),
        d_model=d_model,
        num_heads=field(hf_config, "n_head"),
        num_layers=field(hf_config, "n_layer"),
        d_ff=field(hf_config, "n_inner") or 4 * d_model,
        max_length=field(hf_config, "n_positions"),
        dropout_rate=resid,
        attention_dropout_rate=float(field(hf_config, "attn_pdrop", 0.1)),
        activation=ACTIVATIONS[activation],
        layer_norm_epsilon=float(field(hf_config, "layer_norm_epsilon", 1e-5)),
        dtype=dtype,
        param_dtype=param_dtype,
    )


def to_hf_config(config: GPT2Config) -> Any:
    """GPT2Config -> transformers.GPT2Config (needs transformers installed)."""
    import transformers

    refuse_attention_pattern(config, "GPT-2")
    if config.num_experts:
        raise ValueError(
            f"GPT2Config.num_experts={config.num_experts}: Hugging Face's GPT-2 has no Mixture-of-Experts layers; "
            "only dense GPT-2 configs (num_experts=0) can be exported."
        )
    if config.block_position_embeddings:
        raise ValueError(
            "GPT2Config.block_position_embeddings=True (GLM): Hugging Face's GPT-2 has no second position table; "
            "only GPT-2 configs without it can be exported."
        )
    if config.activation not in TO_HF_ACTIVATION:
        raise ValueError(
            f"GPT2Config.activation={config.activation!r} has no Hugging Face equivalent; use one of "
            f"{sorted(TO_HF_ACTIVATION)}."
        )
    special = {} if config.vocab_size > 50256 else {"bos_token_id": None, "eos_token_id": None}
    return transformers.GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.max_length, n_embd=config.d_model,
        n_layer=config.num_layers, n_head=config.num_heads, n_inner=config.d_ff,
        activation_function=TO_HF_ACTIVATION[config.activation], resid_pdrop=config.dropout_rate,
        embd_pdrop=config.dropout_rate, attn_pdrop=config.attention_dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon, **special,
    )


def build_hf_model(config: GPT2Config) -> Any:
    """A randomly initialised transformers GPT2LMHeadModel of `config` (works under `torch.device('meta')`)."""
    import transformers

    return transformers.GPT2LMHeadModel(to_hf_config(config))


def backbone_rules(config: GPT2Config) -> list[Rule]:
    """The transformer's rules (`transformer.` keys), which are all of GPT2LMHeadModel's but the tied lm_head."""
    e, h, d = config.d_model, config.num_heads, config.head_dim
    rules = [
        one_to_one("transformer.wte.weight", ("token_embedder", "embedding")),
        one_to_one("transformer.wpe.weight", ("position_embedder", "embedding")),
    ]

    def norm(hf: str, ours: tuple[str, ...]) -> None:
        rules.append(one_to_one(f"{hf}.weight", (*ours, "scale")))
        rules.append(one_to_one(f"{hf}.bias", (*ours, "bias")))

    for i in range(config.num_layers):
        hf, ours = f"transformer.h.{i}", (f"layers_{i}",)
        attn = (*ours, "attention")
        qkv = tuple((*attn, name) for name in ("query", "key", "value"))
        rules.append(Rule(
            f"{hf}.attn.c_attn.weight", tuple((*p, "kernel") for p in qkv),
            lambda w: [part.reshape(e, h, d) for part in np.split(w, 3, axis=1)],
            lambda ws: np.concatenate([w.reshape(e, h * d) for w in ws], axis=1),
        ))
        rules.append(Rule(
            f"{hf}.attn.c_attn.bias", tuple((*p, "bias") for p in qkv),
            lambda b: [part.reshape(h, d) for part in np.split(b, 3)],
            lambda bs: np.concatenate([b.reshape(h * d) for b in bs]),
        ))
        rules.append(one_to_one(
            f"{hf}.attn.c_proj.weight", (*attn, "out", "kernel"),
            lambda w: w.reshape(h, d, e), lambda w: w.reshape(h * d, e),
        ))
        rules.append(one_to_one(f"{hf}.attn.c_proj.bias", (*attn, "out", "bias")))
        for hf_name, name in (("c_fc", "wi"), ("c_proj", "wo")):
            rules.append(one_to_one(f"{hf}.mlp.{hf_name}.weight", (*ours, "mlp", name, "kernel")))
            rules.append(one_to_one(f"{hf}.mlp.{hf_name}.bias", (*ours, "mlp", name, "bias")))
        norm(f"{hf}.ln_1", (*ours, "pre_attention_layer_norm"))
        norm(f"{hf}.ln_2", (*ours, "pre_mlp_layer_norm"))
    norm("transformer.ln_f", ("decoder_norm",))
    return rules


def hf_to_params(state_dict: dict[str, Any], config: GPT2Config) -> Params:
    """HF GPT2LMHeadModel (or GPT2Model, 'transformer.'-prefixed) state dict -> {'params': tree} of numpy arrays.

    The tied lm_head.weight and the legacy causal-mask buffers (attn.bias, attn.masked_bias) are ignored.
    """
    buffers = {k for k in state_dict if k.endswith((".attn.bias", ".attn.masked_bias"))}
    return rules_to_params(state_dict, backbone_rules(config), {"lm_head.weight"} | buffers, str(config))


def params_to_hf(params: Params, config: GPT2Config) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of GPT2LMHeadModel's `state_dict()` (lm_head.weight is the tied wte)."""
    state = params_to_rules(params, backbone_rules(config), str(config))
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state
