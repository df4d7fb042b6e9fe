"""Hugging Face T5 <-> ptmjax: configs and state dicts (weights as numpy arrays).

HF Linear weights are [out, in]; ours are [in, ...out] with heads split out:
q/k/v [H*D, E] -> [E, H, D], o [E, H*D] -> [H, D, E], wi [F, E] -> [E, F],
wo [E, F] -> [F, E], lm_head [V, E] -> logits_dense [E, V]. HF keeps the
relative bias in block 0 of each stack; we keep it once per stack.

Note on transformers >= 5: `T5Config.__post_init__` forces
`tie_word_embeddings=True` and records the v1.1 "no output scaling" choice in
`scale_decoder_outputs`; a freshly built v1.1 model then ties `lm_head` to the
input embedding (checkpoints with a distinct `lm_head` are untied on load).
`build_hf_model` gives an untied config its own `lm_head`, as T5 v1.1 has.
A checkpoint saved tied and unscaled (no `lm_head.weight`) imports with the
shared embedding copied into `logits_dense`.

mT5 (model_type 'mt5', MT5ForConditionalGeneration) is T5 v1.1 with the same
keys; transformers 5's MT5Config forces `tie_word_embeddings=True` and never
scales the output, so an mT5 imports untied (`hf_model_type='mt5'`) whatever
its config says, and exports with its own `lm_head.weight`, which
transformers keeps untied on load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import numpy as np

from ptmjax.convert.hf_heads import BaseModel, Head
from ptmjax.convert.state_dict import Params, field, one_to_one, refuse_attention_pattern, rules_to_params
from ptmjax.models.t5 import EncoderDecoder, T5Config

HEADS = {"t5": {"T5ForConditionalGeneration": Head(EncoderDecoder)},
         "mt5": {"MT5ForConditionalGeneration": Head(EncoderDecoder)}}
BASE_MODELS = {"T5Model": BaseModel("T5ForConditionalGeneration", ""),
               "MT5Model": BaseModel("MT5ForConditionalGeneration", "")}
FAMILIES = {"t5": ("T5Config", "T5ForConditionalGeneration"), "mt5": ("MT5Config", "MT5ForConditionalGeneration")}

FEED_FORWARD_PROJ = {"relu": ("relu",), "gated-gelu": ("gelu", "linear")}
# Keys HF stores that carry no information of their own (tied copies, unused weights).
IGNORED_HF_KEYS = (
    "encoder.embed_tokens.weight",
    "decoder.embed_tokens.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",
)
Rule = tuple[str, tuple[str, ...], Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def family(config: T5Config) -> str:
    """'mt5' for an mT5 config, else 't5'."""
    return config.hf_model_type or "t5"


def _tied(hf_config: Any) -> bool:
    """Whether the output layer is the shared embedding scaled by d_model**-0.5 (T5 v1.0)."""
    if field(hf_config, "model_type", "t5") == "mt5":
        return False
    tied = bool(field(hf_config, "tie_word_embeddings", True))
    scaled = field(hf_config, "scale_decoder_outputs", None)  # transformers >= 5
    if scaled is not None:
        if bool(scaled) and not tied:
            raise ValueError(
                "unsupported Hugging Face T5 combination scale_decoder_outputs=True with tie_word_embeddings=False; "
                "ptmjax scales logits by d_model**-0.5 only when embeddings are tied."
            )
        tied = bool(scaled)
    return tied


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> T5Config:
    """transformers.T5Config / MT5Config (or its config.json dict) -> T5Config."""
    model_type = field(hf_config, "model_type", "t5")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported Hugging Face T5 model_type={model_type!r}; supported: {sorted(FAMILIES)}.")
    proj = field(hf_config, "feed_forward_proj", "relu")
    if proj not in FEED_FORWARD_PROJ:
        raise ValueError(
            f"unsupported Hugging Face T5 feed_forward_proj={proj!r}; supported: {sorted(FEED_FORWARD_PROJ)}."
        )
    if field(hf_config, "is_encoder_decoder", True) is not True:
        raise ValueError("unsupported Hugging Face T5 is_encoder_decoder=False; only encoder-decoder T5 converts.")
    num_layers = field(hf_config, "num_layers")
    return T5Config(
        vocab_size=field(hf_config, "vocab_size"),
        d_model=field(hf_config, "d_model"),
        num_heads=field(hf_config, "num_heads"),
        head_dim=field(hf_config, "d_kv"),
        d_ff=field(hf_config, "d_ff"),
        num_encoder_layers=num_layers,
        num_decoder_layers=field(hf_config, "num_decoder_layers") or num_layers,
        ffn_activations=FEED_FORWARD_PROJ[proj],
        tie_embeddings=_tied(hf_config),
        dropout_rate=float(field(hf_config, "dropout_rate", 0.1)),
        relative_attention_num_buckets=field(hf_config, "relative_attention_num_buckets", 32),
        relative_attention_max_distance=field(hf_config, "relative_attention_max_distance", 128),
        layer_norm_epsilon=float(field(hf_config, "layer_norm_epsilon", 1e-6)),
        dtype=dtype,
        param_dtype=param_dtype,
        hf_model_type=None if model_type == "t5" else model_type,
    )


def to_hf_config(config: T5Config) -> Any:
    """T5Config -> transformers.T5Config or MT5Config (needs transformers installed)."""
    import transformers

    return getattr(transformers, FAMILIES[family(config)][0])(**hf_config_fields(config))


def hf_config_fields(config: T5Config) -> dict[str, Any]:
    """The fields of the Hugging Face config of `config` that T5, mT5 and LongT5 share."""
    refuse_attention_pattern(config, "T5")
    if config.num_experts:
        raise ValueError(
            f"num_experts={config.num_experts}: Hugging Face's T5 has no Mixture-of-Experts layers; "
            "only dense T5 configs (num_experts=0) can be exported."
        )
    proj = {v: k for k, v in FEED_FORWARD_PROJ.items()}.get(config.ffn_activations)
    if proj is None:
        raise ValueError(
            f"ffn_activations={config.ffn_activations} has no Hugging Face T5 equivalent; "
            f"supported: {sorted(FEED_FORWARD_PROJ.values())}."
        )
    return dict(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.head_dim,
        d_ff=config.d_ff,
        num_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        dropout_rate=config.dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon,
        feed_forward_proj=proj,
        tie_word_embeddings=config.tie_embeddings,
    )


def build_hf_model(config: T5Config) -> Any:
    """A randomly initialised transformers (M)T5ForConditionalGeneration with the architecture of `config`.

    Works under `with torch.device('meta')` (for counting parameters). Untied
    configs get an `lm_head` separate from the shared input embedding.
    """
    import transformers

    return untied(getattr(transformers, FAMILIES[family(config)][1])(to_hf_config(config)), config)


def untied(model: Any, config: T5Config) -> Any:
    """`model` (a transformers T5-like model) with its own `lm_head` if `config` is untied (transformers 5 ties
    a fresh one to the input embedding)."""
    import torch

    if not config.tie_embeddings and model.lm_head.weight is model.shared.weight:
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
        torch.nn.init.normal_(model.lm_head.weight, mean=0.0, std=1.0)  # HF's init for an untied lm_head
        model.all_tied_weights_keys.pop("lm_head.weight", None)
    return model


def t5_rules(config: T5Config) -> list[Rule]:
    """(hf_key, our_path, hf->ours, ours->hf) for every parameter of `config`."""
    e, h, d = config.d_model, config.num_heads, config.head_dim
    ident = (lambda w: w, lambda w: w)
    qkv = (lambda w: w.T.reshape(e, h, d), lambda w: w.reshape(e, h * d).T)
    out = (lambda w: w.T.reshape(h, d, e), lambda w: w.reshape(h * d, e).T)
    transpose = (lambda w: w.T, lambda w: w.T)
    mlp_names = ["wi"] if len(config.ffn_activations) == 1 else [f"wi_{i}" for i in range(len(config.ffn_activations))]

    rules: list[Rule] = [("shared.weight", ("token_embedder", "embedding"), *ident)]

    def attention(hf_prefix: str, ours: tuple[str, ...]) -> None:
        for hf_name, name in (("q", "query"), ("k", "key"), ("v", "value")):
            rules.append((f"{hf_prefix}.{hf_name}.weight", (*ours, name, "kernel"), *qkv))
        rules.append((f"{hf_prefix}.o.weight", (*ours, "out", "kernel"), *out))

    def mlp(hf_prefix: str, ours: tuple[str, ...]) -> None:
        for name in mlp_names:
            rules.append((f"{hf_prefix}.DenseReluDense.{name}.weight", (*ours, "mlp", name, "kernel"), *transpose))
        rules.append((f"{hf_prefix}.DenseReluDense.wo.weight", (*ours, "mlp", "wo", "kernel"), *transpose))

    def norm(hf_key: str, ours: tuple[str, ...]) -> None:
        rules.append((hf_key, (*ours, "scale"), *ident))

    for stack, n_layers in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        relpos = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        rules.append((relpos, (stack, "relpos_bias", "rel_embedding"), *ident))
        for i in range(n_layers):
            hf, ours = f"{stack}.block.{i}.layer", (stack, f"layers_{i}")
            if stack == "encoder":
                attention(f"{hf}.0.SelfAttention", (*ours, "attention"))
                norm(f"{hf}.0.layer_norm.weight", (*ours, "pre_attention_layer_norm"))
                mlp(f"{hf}.1", ours)
                norm(f"{hf}.1.layer_norm.weight", (*ours, "pre_mlp_layer_norm"))
            else:
                attention(f"{hf}.0.SelfAttention", (*ours, "self_attention"))
                norm(f"{hf}.0.layer_norm.weight", (*ours, "pre_self_attention_layer_norm"))
                attention(f"{hf}.1.EncDecAttention", (*ours, "encoder_decoder_attention"))
                norm(f"{hf}.1.layer_norm.weight", (*ours, "pre_cross_attention_layer_norm"))
                mlp(f"{hf}.2", ours)
                norm(f"{hf}.2.layer_norm.weight", (*ours, "pre_mlp_layer_norm"))
        norm(f"{stack}.final_layer_norm.weight", (stack, f"{stack}_norm"))
    if not config.tie_embeddings:
        rules.append(("lm_head.weight", ("decoder", "logits_dense", "kernel"), *transpose))
    return rules


def hf_to_params(state_dict: Mapping[str, Any], config: T5Config) -> Params:
    """HF T5ForConditionalGeneration state dict -> ptmjax params tree (plain numpy arrays, no boxes).

    Raises KeyError naming missing keys and unexpected keys (a config mismatch).
    An unscaled config without an `lm_head.weight` (transformers 5 saves a T5
    built with `tie_word_embeddings=False` as tied and unscaled: its output
    layer is the shared embedding, with no d_model**-0.5 scale) gets the shared
    embedding as its `logits_dense` kernel: the same logits, exactly.
    """
    return state_to_params(state_dict, config, t5_rules(config))


def state_to_params(state_dict: Mapping[str, Any], config: T5Config, rules: list[Rule]) -> Params:
    """`hf_to_params` by the given rules (T5's, or LongT5's, ptmjax/convert/hf_longt5.py)."""
    if not config.tie_embeddings and "lm_head.weight" not in state_dict and "shared.weight" in state_dict:
        state_dict = {**state_dict, "lm_head.weight": state_dict["shared.weight"]}
    ignorable = set(IGNORED_HF_KEYS) | ({"lm_head.weight"} if config.tie_embeddings else set())
    return rules_to_params(state_dict, [one_to_one(*rule) for rule in rules], ignorable, f"{config}")


def params_to_hf(params: Params, config: T5Config) -> dict[str, np.ndarray]:
    """ptmjax params (boxed or not, with or without the top 'params' key) -> HF state dict of numpy arrays.

    Emits every key of HF's `state_dict()`, including the tied copies of the embedding.
    """
    return params_to_state(params, config, t5_rules(config))


def params_to_state(params: Params, config: T5Config, rules: list[Rule]) -> dict[str, np.ndarray]:
    """`params_to_hf` by the given rules."""
    tree = nn.meta.unbox(params)
    tree = tree.get("params", tree)
    state: dict[str, np.ndarray] = {}
    for hf_key, path, _, to_hf in rules:
        node = tree
        for part in path:
            if part not in node:
                raise KeyError(f"params have no {'/'.join(path)} (needed for {hf_key}); is {config} the right config?")
            node = node[part]
        state[hf_key] = np.ascontiguousarray(to_hf(np.asarray(node)))
    state["encoder.embed_tokens.weight"] = state["shared.weight"]
    state["decoder.embed_tokens.weight"] = state["shared.weight"]
    if config.tie_embeddings:
        state["lm_head.weight"] = state["shared.weight"]
    return state
