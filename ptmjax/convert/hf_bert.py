"""Hugging Face BERT / RoBERTa <-> ptmjax: configs and state dicts (weights as numpy arrays).

Families and HF classes: BERT with the NSP head <-> BertForPreTraining,
BERT without it <-> BertForMaskedLM, RoBERTa <-> RobertaForMaskedLM.
HF Linear weights are [out, in]: q/k/v [H*D, E] -> [E, H, D] (bias -> [H, D]),
attention output [E, H*D] -> [H, D, E], other dense layers transposed.
The MLM decoder weight is tied to the word embedding and its bias to the head's bias.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ptmjax.convert.state_dict import Params, Rule, field, one_to_one, params_to_rules, require, rules_to_params
from ptmjax.models.bert import BertConfig

ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu": "relu", "silu": "silu"}
TO_HF_ACTIVATION = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu", "silu": "silu"}
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
    name = "BERT" if model_type == "bert" else "RoBERTa"
    require(hf_config, name, "position_embedding_type", ["absolute"], "absolute")
    require(hf_config, name, "is_decoder", [False], False)
    require(hf_config, name, "add_cross_attention", [False], False)
    require(hf_config, name, "tie_word_embeddings", [True], True)
    activation = require(hf_config, name, "hidden_act", list(ACTIVATIONS), "gelu")
    defaults = FAMILY_DEFAULTS[model_type]
    pad = field(hf_config, "pad_token_id", defaults["pad_token_id"])
    return BertConfig(
        vocab_size=field(hf_config, "vocab_size"),
        d_model=field(hf_config, "hidden_size"),
        num_heads=field(hf_config, "num_attention_heads"),
        num_layers=field(hf_config, "num_hidden_layers"),
        d_ff=field(hf_config, "intermediate_size"),
        max_length=field(hf_config, "max_position_embeddings", 512),
        type_vocab_size=field(hf_config, "type_vocab_size", 2),
        pad_token_id=defaults["pad_token_id"] if pad is None else pad,
        positions_after_padding=defaults["positions_after_padding"],
        nsp_head=defaults["nsp_head"] if nsp_head is None else nsp_head,
        dropout_rate=float(field(hf_config, "hidden_dropout_prob", 0.1)),
        attention_dropout_rate=float(field(hf_config, "attention_probs_dropout_prob", 0.1)),
        activation=ACTIVATIONS[activation],
        layer_norm_epsilon=float(field(hf_config, "layer_norm_eps", 1e-12)),
        dtype=dtype,
        param_dtype=param_dtype,
    )


def to_hf_config(config: BertConfig) -> Any:
    """BertConfig -> transformers.BertConfig or RobertaConfig (needs transformers installed)."""
    import transformers

    if config.activation not in TO_HF_ACTIVATION:
        raise ValueError(
            f"BertConfig.activation={config.activation!r} has no Hugging Face equivalent; use one of "
            f"{sorted(TO_HF_ACTIVATION)}."
        )
    kwargs = dict(
        vocab_size=config.vocab_size, hidden_size=config.d_model, num_attention_heads=config.num_heads,
        num_hidden_layers=config.num_layers, intermediate_size=config.d_ff, max_position_embeddings=config.max_length,
        type_vocab_size=config.type_vocab_size, pad_token_id=config.pad_token_id,
        hidden_act=TO_HF_ACTIVATION[config.activation], hidden_dropout_prob=config.dropout_rate,
        attention_probs_dropout_prob=config.attention_dropout_rate, layer_norm_eps=config.layer_norm_epsilon,
    )  # fmt: skip
    if family(config) == "roberta":
        return transformers.RobertaConfig(**kwargs)
    return transformers.BertConfig(**kwargs)


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


def _rules(config: BertConfig) -> list[Rule]:
    e, h, d = config.d_model, config.num_heads, config.head_dim
    transpose = {"to_ours": lambda w: w.T, "to_hf": lambda w: w.T}
    base = family(config)
    head = "lm_head" if base == "roberta" else "cls.predictions"
    rules = [
        one_to_one(f"{base}.embeddings.word_embeddings.weight", ("token_embedder", "embedding")),
        one_to_one(f"{base}.embeddings.position_embeddings.weight", ("position_embedder", "embedding")),
        one_to_one(f"{base}.embeddings.token_type_embeddings.weight", ("token_type_embedder", "embedding")),
        one_to_one(f"{head}.bias", ("mlm_bias",)),
    ]

    def norm(hf: str, ours: tuple[str, ...]) -> None:
        rules.append(one_to_one(f"{hf}.weight", (*ours, "scale")))
        rules.append(one_to_one(f"{hf}.bias", (*ours, "bias")))

    def dense(hf: str, ours: tuple[str, ...]) -> None:
        rules.append(one_to_one(f"{hf}.weight", (*ours, "kernel"), **transpose))
        rules.append(one_to_one(f"{hf}.bias", (*ours, "bias")))

    norm(f"{base}.embeddings.LayerNorm", ("embedding_layer_norm",))
    for i in range(config.num_layers):
        hf, ours = f"{base}.encoder.layer.{i}", (f"layers_{i}",)
        for name in ("query", "key", "value"):
            path = (*ours, "attention", name)
            rules.append(one_to_one(
                f"{hf}.attention.self.{name}.weight", (*path, "kernel"),
                lambda w: w.T.reshape(e, h, d), lambda w: w.reshape(e, h * d).T,
            ))  # fmt: skip
            rules.append(one_to_one(
                f"{hf}.attention.self.{name}.bias", (*path, "bias"),
                lambda b: b.reshape(h, d), lambda b: b.reshape(h * d),
            ))  # fmt: skip
        out = (*ours, "attention", "out")
        rules.append(one_to_one(
            f"{hf}.attention.output.dense.weight", (*out, "kernel"),
            lambda w: w.T.reshape(h, d, e), lambda w: w.reshape(h * d, e).T,
        ))  # fmt: skip
        rules.append(one_to_one(f"{hf}.attention.output.dense.bias", (*out, "bias")))
        norm(f"{hf}.attention.output.LayerNorm", (*ours, "attention_layer_norm"))
        dense(f"{hf}.intermediate.dense", (*ours, "mlp", "wi"))
        dense(f"{hf}.output.dense", (*ours, "mlp", "wo"))
        norm(f"{hf}.output.LayerNorm", (*ours, "mlp_layer_norm"))
    if base == "roberta":
        dense("lm_head.dense", ("mlm_transform",))
        norm("lm_head.layer_norm", ("mlm_layer_norm",))
    else:
        dense("cls.predictions.transform.dense", ("mlm_transform",))
        norm("cls.predictions.transform.LayerNorm", ("mlm_layer_norm",))
    if config.nsp_head:
        dense(f"{base}.pooler.dense", ("pooler",))
        dense("cls.seq_relationship", ("nsp",))
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
    base = family(config)
    ignorable = set(_tied_keys(config)) | {f"{base}.embeddings.position_ids", f"{base}.embeddings.token_type_ids"}
    return rules_to_params(state_dict, _rules(config), ignorable, str(config))


def params_to_hf(params: Params, config: BertConfig) -> dict[str, np.ndarray]:
    """ptmjax params -> every key of the HF model's `state_dict()`, tied copies included."""
    state = params_to_rules(params, _rules(config), str(config))
    for tied, source in _tied_keys(config).items():
        state[tied] = state[source]
    return state
