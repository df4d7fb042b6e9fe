"""Hugging Face ELECTRA <-> ptmjax: configs and state dicts (weights as numpy arrays).

One ElectraConfig describes either model; `role` picks the head and the HF class:
'discriminator' <-> ElectraForPreTraining (`ElectraDiscriminator`),
'generator' <-> ElectraForMaskedLM (`ElectraGenerator`). HF has
`electra.embeddings_project` exactly when embedding_size != hidden_size, which
ptmjax expresses as embedding_size=None when they are equal. The generator's
`generator_lm_head.weight` is tied to the word embedding; its bias is its own.
`pretraining_to_hf` / `hf_to_pretraining` convert the joint `ElectraPretraining`
parameters to and from the two HF state dicts, which then hold the same embeddings.
Tensor layouts: see hf_encoder.py.
"""

from __future__ import annotations

from typing import Any, Literal

import flax.linen as nn
import numpy as np

from ptmjax.convert.hf_encoder import (
    BERT_LAYER_NAMES,
    HFLayout,
    backbone_rules,
    dense_rules,
    encoder_fields,
    hf_encoder_kwargs,
    mlm_head_rules,
    params_to_state,
    refuse_unless,
    state_to_params,
)
from ptmjax.convert.hf_heads import BaseModel, Head
from ptmjax.convert.state_dict import Params, Rule, field, require
from ptmjax.models.electra import ElectraConfig, ElectraDiscriminator, ElectraGenerator, ElectraPretrainingConfig

Role = Literal["discriminator", "generator"]
HEADS = {"electra": {
    "ElectraForPreTraining": Head(ElectraDiscriminator, convert_kwargs={"role": "discriminator"}),
    "ElectraForMaskedLM": Head(ElectraGenerator, convert_kwargs={"role": "generator"}),
}}
BASE_MODELS = {"ElectraModel": BaseModel("ElectraForPreTraining", "electra.")}

HF_CLASSES = {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM"}
LAYOUT = HFLayout(
    embeddings="electra.embeddings", layer="electra.encoder.layer.{}", projection="electra.embeddings_project",
    **BERT_LAYER_NAMES,
)
TIED = {"discriminator": {}, "generator": {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"}}


def from_hf_config(hf_config: Any, dtype: str = "float32", param_dtype: str = "float32") -> ElectraConfig:
    """transformers.ElectraConfig (or a config.json dict) -> ElectraConfig; unsupported values raise, naming the field.

    The same config serves the generator and the discriminator (see `role`).
    """
    require(hf_config, "ELECTRA", "model_type", ["electra"], "electra")
    fields = encoder_fields(hf_config, "ELECTRA")
    embedding_size = field(hf_config, "embedding_size", 128)
    return ElectraConfig(
        **fields,
        pad_token_id=field(hf_config, "pad_token_id", 0),
        embedding_size=None if embedding_size == fields["d_model"] else embedding_size,
        dtype=dtype,
        param_dtype=param_dtype,
    )


def to_hf_config(config: ElectraConfig) -> Any:
    """ElectraConfig -> transformers.ElectraConfig (needs transformers installed)."""
    import transformers

    refuse_unless(config, "ELECTRA", positions_after_padding=(False,), num_layer_groups=(None, config.num_layers))
    if config.embedding_size == config.d_model:
        raise ValueError(
            f"ElectraConfig.embedding_size={config.embedding_size} equals d_model: Hugging Face ELECTRA has no "
            "projection then; use embedding_size=None."
        )
    return transformers.ElectraConfig(**hf_encoder_kwargs(config), embedding_size=config.embed_dim)


def build_hf_model(config: ElectraConfig, role: Role = "discriminator") -> Any:
    """A randomly initialised transformers model of `config` (works under `torch.device('meta')`)."""
    import transformers

    return getattr(transformers, HF_CLASSES[_check_role(role)])(to_hf_config(config))


def _check_role(role: str) -> str:
    if role not in HF_CLASSES:
        raise ValueError(f"unknown ELECTRA role {role!r}; known: {sorted(HF_CLASSES)}.")
    return role


def _rules(config: ElectraConfig, role: Role) -> list[Rule]:
    rules = backbone_rules(config, LAYOUT)
    if _check_role(role) == "generator":
        return rules + mlm_head_rules("generator_predictions.dense", "generator_predictions.LayerNorm",
                                      "generator_lm_head.bias")
    return [
        *rules,
        *dense_rules("discriminator_predictions.dense", ("discriminator_head", "dense")),
        *dense_rules("discriminator_predictions.dense_prediction", ("discriminator_head", "prediction")),
    ]


def hf_to_params(state_dict: dict[str, Any], config: ElectraConfig, role: Role = "discriminator") -> Params:
    """HF state dict of the role's class -> {'params': tree} of numpy arrays."""
    return state_to_params(state_dict, _rules(config, role), TIED[role], LAYOUT, f"{role} {config}")


def params_to_hf(params: Params, config: ElectraConfig, role: Role = "discriminator") -> dict[str, np.ndarray]:
    """ptmjax params -> every key of the role's HF `state_dict()`, tied copies included."""
    return params_to_state(params, _rules(config, role), TIED[role], f"{role} {config}")


def pretraining_to_hf(params: Params, config: ElectraPretrainingConfig) -> dict[str, dict[str, np.ndarray]]:
    """`ElectraPretraining` params -> {'generator': state dict, 'discriminator': state dict}.

    Both state dicts hold the shared embeddings.
    """
    tree = nn.meta.unbox(params)
    tree = tree.get("params", tree)
    return {
        role: params_to_hf({**tree[role], "embeddings": tree["embeddings"]}, getattr(config, role), role)
        for role in ("generator", "discriminator")
    }


def hf_to_pretraining(
    generator_state: dict[str, Any], discriminator_state: dict[str, Any], config: ElectraPretrainingConfig
) -> Params:
    """The two HF state dicts -> `ElectraPretraining` params; raises unless their embeddings are identical."""
    trees = {
        role: hf_to_params(state, getattr(config, role), role)["params"]
        for role, state in (("generator", generator_state), ("discriminator", discriminator_state))
    }
    embeddings = {role: trees[role].pop("embeddings") for role in trees}
    for module, tables in embeddings["generator"].items():
        for name, value in tables.items():
            if not np.array_equal(value, embeddings["discriminator"][module][name]):
                raise ValueError(
                    f"the generator's and discriminator's embeddings differ at {module}/{name}; ElectraPretraining "
                    "shares one embedding block, so both state dicts must hold the same one."
                )
    return {"params": {"embeddings": embeddings["discriminator"], **trees}}
