"""Conversion machinery shared by the post-LN encoder families (hf_bert, hf_albert, hf_electra).

The families differ only in where Hugging Face keeps each tensor (`HFLayout`)
and in their heads; the config fields, the backbone rules (embeddings,
projection, layers) and the head rules are built here.
HF Linear weights are [out, in]: q/k/v [H*D, E] -> [E, H, D] (bias -> [H, D]),
attention output [E, H*D] -> [H, D, E], other dense layers transposed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

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
from ptmjax.models.encoder import EncoderConfig

ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu", "silu": "silu"}
TO_HF_ACTIVATION = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu", "silu": "silu"}
TRANSPOSE = {"to_ours": lambda w: w.T, "to_hf": lambda w: w.T}


@dataclasses.dataclass(frozen=True)
class HFLayout:
    """Where one HF family keeps the backbone's tensors.

    layer: prefix of a layer's parameter set, formatted with its index.
    The other names are relative to that prefix (q/k/v, attention output,
    the two LayerNorms, the feed-forward in and out).
    projection: the embedding projection E -> d_model (None: the family has none).
    """

    embeddings: str
    layer: str
    query: str
    key: str
    value: str
    attention_out: str
    attention_norm: str
    ffn_in: str
    ffn_out: str
    ffn_norm: str
    projection: str | None = None


BERT_LAYER_NAMES = {
    "query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
    "attention_out": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense", "ffn_out": "output.dense", "ffn_norm": "output.LayerNorm",
}


def encoder_fields(hf_config: Any, family: str) -> dict[str, Any]:
    """`EncoderConfig` fields every family reads alike; raises naming an unsupported field."""
    require(hf_config, family, "position_embedding_type", ["absolute"], "absolute")
    require(hf_config, family, "is_decoder", [False], False)
    require(hf_config, family, "add_cross_attention", [False], False)
    require(hf_config, family, "tie_word_embeddings", [True], True)
    activation = require(hf_config, family, "hidden_act", list(ACTIVATIONS), "gelu")
    return dict(
        vocab_size=field(hf_config, "vocab_size"),
        d_model=field(hf_config, "hidden_size"),
        num_heads=field(hf_config, "num_attention_heads"),
        num_layers=field(hf_config, "num_hidden_layers"),
        d_ff=field(hf_config, "intermediate_size"),
        max_length=field(hf_config, "max_position_embeddings", 512),
        type_vocab_size=field(hf_config, "type_vocab_size", 2),
        dropout_rate=float(field(hf_config, "hidden_dropout_prob", 0.1)),
        attention_dropout_rate=float(field(hf_config, "attention_probs_dropout_prob", 0.1)),
        activation=ACTIVATIONS[activation],
        layer_norm_epsilon=float(field(hf_config, "layer_norm_eps", 1e-12)),
    )


def refuse_unless(config: EncoderConfig, family: str, **allowed: tuple[Any, ...]) -> None:
    """Raise, naming the field, when a config field has a value the HF family cannot express."""
    for name, values in allowed.items():
        value = getattr(config, name)
        if value not in values:
            raise ValueError(
                f"{type(config).__name__}.{name}={value!r} has no Hugging Face {family} equivalent; "
                f"use {name} in {list(values)}."
            )


def hf_encoder_kwargs(config: EncoderConfig) -> dict[str, Any]:
    """The HF config kwargs every family writes alike (`to_hf_config`)."""
    refuse_unless(config, "encoder", activation=tuple(TO_HF_ACTIVATION), num_languages=(0,))
    refuse_attention_pattern(config, "encoder")
    return dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.num_heads,
        num_hidden_layers=config.num_layers, intermediate_size=config.d_ff, max_position_embeddings=config.max_length,
        type_vocab_size=config.type_vocab_size, pad_token_id=config.pad_token_id,
        hidden_act=TO_HF_ACTIVATION[config.activation], hidden_dropout_prob=config.dropout_rate,
        attention_probs_dropout_prob=config.attention_dropout_rate, layer_norm_eps=config.layer_norm_epsilon,
    )


def norm_rules(hf: str, ours: tuple[str, ...]) -> list[Rule]:
    """A LayerNorm: weight/bias <-> scale/bias."""
    return [one_to_one(f"{hf}.weight", (*ours, "scale")), one_to_one(f"{hf}.bias", (*ours, "bias"))]


def dense_rules(hf: str, ours: tuple[str, ...]) -> list[Rule]:
    """A Linear with bias <-> a 2-D Dense (kernel transposed)."""
    return [one_to_one(f"{hf}.weight", (*ours, "kernel"), **TRANSPOSE), one_to_one(f"{hf}.bias", (*ours, "bias"))]


def backbone_rules(config: EncoderConfig, layout: HFLayout) -> list[Rule]:
    """Embeddings, the projection (when factorized) and every layer parameter set."""
    e, h, d = config.d_model, config.num_heads, config.head_dim
    hf_emb, emb = layout.embeddings, ("embeddings",)
    token_types = (  # MPNet has none
        [one_to_one(f"{hf_emb}.token_type_embeddings.weight", (*emb, "token_type_embedder", "embedding"))]
        if config.type_vocab_size else []
    )
    rules = [
        one_to_one(f"{hf_emb}.word_embeddings.weight", (*emb, "token_embedder", "embedding")),
        one_to_one(f"{hf_emb}.position_embeddings.weight", (*emb, "position_embedder", "embedding")),
        *token_types,
        *norm_rules(f"{hf_emb}.LayerNorm", (*emb, "layer_norm")),
    ]
    if config.embedding_size is not None:
        if layout.projection is None:
            raise ValueError(f"{type(config).__name__}.embedding_size must be None: this family has no projection.")
        rules += dense_rules(layout.projection, ("embedding_projection",))
    for i in range(config.layer_groups):
        hf, ours = layout.layer.format(i), (f"layers_{i}",)
        for hf_name, name in ((layout.query, "query"), (layout.key, "key"), (layout.value, "value")):
            path = (*ours, "attention", name)
            rules.append(one_to_one(
                f"{hf}.{hf_name}.weight", (*path, "kernel"),
                lambda w: w.T.reshape(e, h, d), lambda w: w.reshape(e, h * d).T,
            ))
            rules.append(one_to_one(
                f"{hf}.{hf_name}.bias", (*path, "bias"), lambda b: b.reshape(h, d), lambda b: b.reshape(h * d),
            ))
        out = (*ours, "attention", "out")
        rules.append(one_to_one(
            f"{hf}.{layout.attention_out}.weight", (*out, "kernel"),
            lambda w: w.T.reshape(h, d, e), lambda w: w.reshape(h * d, e).T,
        ))
        rules.append(one_to_one(f"{hf}.{layout.attention_out}.bias", (*out, "bias")))
        rules += norm_rules(f"{hf}.{layout.attention_norm}", (*ours, "attention_layer_norm"))
        rules += dense_rules(f"{hf}.{layout.ffn_in}", (*ours, "mlp", "wi"))
        rules += dense_rules(f"{hf}.{layout.ffn_out}", (*ours, "mlp", "wo"))
        rules += norm_rules(f"{hf}.{layout.ffn_norm}", (*ours, "mlp_layer_norm"))
    return rules


def mlm_head_rules(dense: str, norm: str, bias: str) -> list[Rule]:
    """The MLM head's transform, LayerNorm and output bias (the decoder weight is the tied word embedding)."""
    head = ("mlm_head",)
    return [*dense_rules(dense, (*head, "transform")), *norm_rules(norm, (*head, "layer_norm")),
            one_to_one(bias, (*head, "bias"))]


def pair_head_rules(pooler: str, classifier: str) -> list[Rule]:
    """The tanh pooler and the 2-way sentence-pair classifier (NSP / SOP)."""
    return [*dense_rules(pooler, ("pair_head", "pooler")), *dense_rules(classifier, ("pair_head", "classifier"))]


def state_to_params(
    state_dict: Mapping[str, Any], rules: list[Rule], tied: Mapping[str, str], layout: HFLayout, what: str
) -> Params:
    """HF state dict -> {'params': tree}; tied copies and the derived position/token-type id buffers are ignored."""
    ignorable = set(tied) | {f"{layout.embeddings}.position_ids", f"{layout.embeddings}.token_type_ids"}
    return rules_to_params(state_dict, rules, ignorable, what)


def params_to_state(params: Params, rules: list[Rule], tied: Mapping[str, str], what: str) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of the HF `state_dict()`, tied copies (key -> the key it copies) included."""
    state = params_to_rules(params, rules, what)
    for copy, source in tied.items():
        state[copy] = state[source]
    return state
