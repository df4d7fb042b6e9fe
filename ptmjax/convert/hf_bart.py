"""Hugging Face BART / mBART <-> ptmjax: configs and state dicts (weights as numpy arrays).

BART <-> BartForConditionalGeneration (pre_layer_norm=False), mBART <->
MBartForConditionalGeneration (pre_layer_norm=True). HF Linear weights are
[out, in]: q/k/v_proj [H*D, E] -> [E, H, D] (bias -> [H, D]), out_proj
[E, H*D] -> [H, D, E], fc1/fc2 transposed. The HF buffer final_logits_bias
[1, V] is our parameter final_logits_bias [V]. The position tables keep HF's
two offset rows. model.encoder/decoder.embed_tokens.weight and lm_head.weight
are tied copies of model.shared.weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptmjax.convert.hf_gpt2 import ACTIVATIONS, TO_HF_ACTIVATION  # HF activation_function <-> ours
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
from ptmjax.models.bart import Bart, BartConfig

HEADS = {"bart": {"BartForConditionalGeneration": Head(Bart)}, "mbart": {"MBartForConditionalGeneration": Head(Bart)}}
BASE_MODELS = {"BartModel": BaseModel("BartForConditionalGeneration", "model."),
               "MBartModel": BaseModel("MBartForConditionalGeneration", "model.")}

FAMILIES = {  # model_type -> (name in errors, transformers config class, model class, pre_layer_norm)
    "bart": ("BART", "BartConfig", "BartForConditionalGeneration", False),
    "mbart": ("mBART", "MBartConfig", "MBartForConditionalGeneration", True),
}
HF_LAYER_NORM_EPSILON = 1e-5  # HF BART's nn.LayerNorm default; its config has no field for it
TIED_KEYS = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def family(config: BartConfig) -> str:
    """'mbart' for pre-LN configs, else 'bart'."""
    return "mbart" if config.pre_layer_norm else "bart"


def _require_equal(hf_config: Any, name: str, encoder_field: str, decoder_field: str) -> int:
    """The shared value of an encoder/decoder pair of fields; raises naming both when they differ."""
    encoder, decoder = field(hf_config, encoder_field), field(hf_config, decoder_field)
    if encoder != decoder:
        raise ValueError(
            f"unsupported Hugging Face {name} {encoder_field}={encoder} != {decoder_field}={decoder}; "
            "ptmjax's Bart uses one value for both stacks."
        )
    return encoder


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> BartConfig:
    """transformers.BartConfig / MBartConfig (or a config.json dict) -> BartConfig.

    Unsupported values raise naming the field, including the legacy config.json
    flags (normalize_before, add_final_layer_norm, ...) when they disagree with
    the architecture transformers builds for the model_type. encoder_layerdrop and
    decoder_layerdrop become `layerdrop` and `decoder_layerdrop` (None when equal).
    """
    model_type = require(hf_config, "BART", "model_type", list(FAMILIES), "bart")
    name, _, _, pre_layer_norm = FAMILIES[model_type]
    for flag, value in (
        ("is_encoder_decoder", True), ("is_decoder", False), ("tie_word_embeddings", True), ("add_bias_logits", False),
        ("static_position_embeddings", False), ("normalize_embedding", True),
        ("normalize_before", pre_layer_norm), ("add_final_layer_norm", pre_layer_norm), ("extra_pos_embeddings", 2),
    ):
        require(hf_config, name, flag, [value], value)
    activation = require(hf_config, name, "activation_function", list(ACTIVATIONS), "gelu")
    pad = field(hf_config, "pad_token_id", 1)
    encoder_layerdrop = float(field(hf_config, "encoder_layerdrop", 0.0))
    decoder_layerdrop = float(field(hf_config, "decoder_layerdrop", 0.0))
    return BartConfig(
        vocab_size=field(hf_config, "vocab_size"),
        d_model=field(hf_config, "d_model"),
        num_heads=_require_equal(hf_config, name, "encoder_attention_heads", "decoder_attention_heads"),
        num_encoder_layers=field(hf_config, "encoder_layers"),
        num_decoder_layers=field(hf_config, "decoder_layers"),
        d_ff=_require_equal(hf_config, name, "encoder_ffn_dim", "decoder_ffn_dim"),
        max_length=field(hf_config, "max_position_embeddings", 1024),
        pad_token_id=1 if pad is None else pad,
        scale_embedding=bool(field(hf_config, "scale_embedding", False)),
        pre_layer_norm=pre_layer_norm,
        dropout_rate=float(field(hf_config, "dropout", 0.1)),
        attention_dropout_rate=float(field(hf_config, "attention_dropout", 0.0)),
        activation_dropout_rate=float(field(hf_config, "activation_dropout", 0.0)),
        activation=ACTIVATIONS[activation],
        layerdrop=encoder_layerdrop,
        decoder_layerdrop=None if decoder_layerdrop == encoder_layerdrop else decoder_layerdrop,
        layer_norm_epsilon=HF_LAYER_NORM_EPSILON,
        dtype=dtype,
        param_dtype=param_dtype,
    )


def to_hf_config(config: BartConfig) -> Any:
    """BartConfig -> transformers.BartConfig or MBartConfig (needs transformers installed)."""
    import transformers

    refuse_attention_pattern(config, "BART")
    if config.activation not in TO_HF_ACTIVATION:
        raise ValueError(
            f"BartConfig.activation={config.activation!r} has no Hugging Face equivalent; use one of "
            f"{sorted(TO_HF_ACTIVATION)}."
        )
    if config.layer_norm_epsilon != HF_LAYER_NORM_EPSILON:
        raise ValueError(
            f"BartConfig.layer_norm_epsilon={config.layer_norm_epsilon} has no Hugging Face equivalent: HF BART's "
            f"LayerNorms use {HF_LAYER_NORM_EPSILON}; set layer_norm_epsilon={HF_LAYER_NORM_EPSILON}."
        )
    config_class = FAMILIES[family(config)][1]
    return getattr(transformers, config_class)(
        vocab_size=config.vocab_size, d_model=config.d_model, max_position_embeddings=config.max_length,
        encoder_layers=config.num_encoder_layers, decoder_layers=config.num_decoder_layers,
        encoder_attention_heads=config.num_heads, decoder_attention_heads=config.num_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff, pad_token_id=config.pad_token_id,
        scale_embedding=config.scale_embedding, dropout=config.dropout_rate,
        attention_dropout=config.attention_dropout_rate, activation_dropout=config.activation_dropout_rate,
        activation_function=TO_HF_ACTIVATION[config.activation], encoder_layerdrop=config.layerdrop,
        decoder_layerdrop=config.stack_layerdrop(("decoder",)),
    )


def build_hf_model(config: BartConfig) -> Any:
    """A randomly initialised (M)BartForConditionalGeneration of `config` (works under `torch.device('meta')`)."""
    import transformers

    return getattr(transformers, FAMILIES[family(config)][2])(to_hf_config(config))


def _rules(config: BartConfig) -> list[Rule]:
    e, h, d = config.d_model, config.num_heads, config.head_dim
    rules = [
        one_to_one("model.shared.weight", ("token_embedder", "embedding")),
        one_to_one("final_logits_bias", ("final_logits_bias",), lambda b: b.reshape(-1), lambda b: b.reshape(1, -1)),
    ]

    def norm(hf: str, ours: tuple[str, ...]) -> None:
        rules.append(one_to_one(f"{hf}.weight", (*ours, "scale")))
        rules.append(one_to_one(f"{hf}.bias", (*ours, "bias")))

    def attention(hf: str, ours: tuple[str, ...]) -> None:
        for hf_name, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            rules.append(one_to_one(
                f"{hf}.{hf_name}.weight", (*ours, name, "kernel"),
                lambda w: w.T.reshape(e, h, d), lambda w: w.reshape(e, h * d).T,
            ))
            rules.append(one_to_one(
                f"{hf}.{hf_name}.bias", (*ours, name, "bias"), lambda b: b.reshape(h, d), lambda b: b.reshape(h * d)
            ))
        rules.append(one_to_one(
            f"{hf}.out_proj.weight", (*ours, "out", "kernel"),
            lambda w: w.T.reshape(h, d, e), lambda w: w.reshape(h * d, e).T,
        ))
        rules.append(one_to_one(f"{hf}.out_proj.bias", (*ours, "out", "bias")))

    for stack, num_layers in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        hf_stack = f"model.{stack}"
        rules.append(one_to_one(f"{hf_stack}.embed_positions.weight", (stack, "position_embedder", "embedding")))
        norm(f"{hf_stack}.layernorm_embedding", (stack, "embedding_layer_norm"))
        self_name = "self_attention" if stack == "decoder" else "attention"
        for i in range(num_layers):
            hf, ours = f"{hf_stack}.layers.{i}", (stack, f"layers_{i}")
            attention(f"{hf}.self_attn", (*ours, self_name))
            norm(f"{hf}.self_attn_layer_norm", (*ours, f"{self_name}_layer_norm"))
            if stack == "decoder":
                attention(f"{hf}.encoder_attn", (*ours, "encoder_decoder_attention"))
                norm(f"{hf}.encoder_attn_layer_norm", (*ours, "encoder_decoder_attention_layer_norm"))
            for hf_name, name in (("fc1", "wi"), ("fc2", "wo")):
                rules.append(one_to_one(f"{hf}.{hf_name}.weight", (*ours, "mlp", name, "kernel"), np.transpose,
                                        np.transpose))
                rules.append(one_to_one(f"{hf}.{hf_name}.bias", (*ours, "mlp", name, "bias")))
            norm(f"{hf}.final_layer_norm", (*ours, "mlp_layer_norm"))
        if config.pre_layer_norm:
            norm(f"{hf_stack}.layer_norm", (stack, f"{stack}_norm"))
    return rules


def hf_to_params(state_dict: dict[str, Any], config: BartConfig) -> Params:
    """HF (M)BartForConditionalGeneration state dict -> {'params': tree} of numpy arrays; tied copies are ignored."""
    return rules_to_params(state_dict, _rules(config), set(TIED_KEYS), str(config))


def params_to_hf(params: Params, config: BartConfig) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of the HF model's `state_dict()`, tied copies included."""
    state = params_to_rules(params, _rules(config), str(config))
    for tied in TIED_KEYS:
        state[tied] = state["model.shared.weight"]
    return state
