"""ELECTRA generator / discriminator parity with Hugging Face transformers and lossless conversion.

Shapes cover E < H (HF embeddings_project), E > H, E == H (no projection),
odd head counts (3, 5) and a tanh-GELU model whose generator head stays erf
GELU as in HF. Inputs are padded with two token types; padding is not compared.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_state_dict, compare_with_hf_encoder, numpy_boxed_variables, perturbed_hf_model

from ptmjax.models.electra import ElectraConfig, ElectraDiscriminator, ElectraGenerator, ElectraPretrainingConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_electra  # noqa: E402

ELECTRA = ElectraConfig(
    vocab_size=101, embedding_size=16, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=24,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)
CASES = {  # name -> (config, role)
    "discriminator_E16_H32_heads_4": (ELECTRA, "discriminator"),
    "discriminator_no_projection_H24_heads_3": (
        dataclasses.replace(ELECTRA, embedding_size=None, d_model=24, num_heads=3, d_ff=40),
        "discriminator",
    ),
    "generator_E16_H20_heads_5": (dataclasses.replace(ELECTRA, d_model=20, num_heads=5, d_ff=40), "generator"),
    "generator_E24_H12_heads_3_tanh_gelu": (
        dataclasses.replace(ELECTRA, embedding_size=24, d_model=12, num_heads=3, d_ff=24, activation="gelu"),
        "generator",
    ),
}
MODELS = {"discriminator": ElectraDiscriminator, "generator": ElectraGenerator}
TOKENS = jnp.full((1, 4), 5, jnp.int32)


def random_hf_model(config: ElectraConfig, role: str):
    return perturbed_hf_model(lambda: hf_electra.build_hf_model(config, role))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_and_hidden_match_transformers_with_padding(name):
    config, role = CASES[name]
    model = random_hf_model(config, role)
    assert type(model).__name__ == hf_electra.HF_CLASSES[role]
    assert hf_electra.from_hf_config(model.config) == config
    params = hf_electra.hf_to_params(model.state_dict(), config, role)
    diffs = compare_with_hf_encoder(
        MODELS[role](config),
        params,
        model,
        config,
        lambda ours, hf_out: {f"{role} logits": (ours, hf_out.logits, True)},
    )
    print(name, {k: f"{v:.2e}" for k, v in diffs.items()})
    assert max(diffs.values()) < 1e-4


@pytest.mark.parametrize("name", sorted(CASES))
def test_conversion_round_trip_is_identity(name):
    config, role = CASES[name]
    state = {k: v.numpy() for k, v in random_hf_model(config, role).state_dict().items()}
    back = hf_electra.params_to_hf(hf_electra.hf_to_params(state, config, role), config, role)
    assert_same_state_dict(back, state)


@pytest.mark.parametrize("role", sorted(MODELS))
def test_boxed_init_params_export_and_reimport(role):
    variables = numpy_boxed_variables(lambda: MODELS[role](ELECTRA).init(jax.random.PRNGKey(0), TOKENS))
    reloaded = hf_electra.hf_to_params(hf_electra.params_to_hf(variables, ELECTRA, role), ELECTRA, role)
    jax.tree.map(np.testing.assert_array_equal, reloaded, jax.tree.map(np.asarray, nn.meta.unbox(variables)))


def test_joint_pretraining_params_round_trip_through_two_hf_models():
    from ptmjax.models.electra import ElectraPretraining

    generator = dataclasses.replace(ELECTRA, d_model=8, num_heads=1, d_ff=16)
    config = ElectraPretrainingConfig(generator=generator, discriminator=ELECTRA)
    variables = numpy_boxed_variables(lambda: ElectraPretraining(config).init(jax.random.PRNGKey(0), *[TOKENS] * 3))
    states = hf_electra.pretraining_to_hf(variables, config)
    for role, state in states.items():  # each loads into its HF class as a complete state dict
        with torch.device("meta"):
            hf = hf_electra.build_hf_model(getattr(config, role), role)
        assert set(state) == set(hf.state_dict()), role
    back = hf_electra.hf_to_pretraining(states["generator"], states["discriminator"], config)
    jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, nn.meta.unbox(variables)))
    key = "electra.embeddings.LayerNorm.bias"
    states["generator"][key] = states["generator"][key] + 1
    with pytest.raises(ValueError, match="layer_norm/bias"):
        hf_electra.hf_to_pretraining(states["generator"], states["discriminator"], config)


def test_config_round_trip_and_unsupported_values_are_named():
    for config, _ in CASES.values():
        assert hf_electra.from_hf_config(hf_electra.to_hf_config(config)) == config
    hf = hf_electra.to_hf_config(ELECTRA).to_dict()
    for name, value in (
        ("position_embedding_type", "relative_key"), ("is_decoder", True), ("add_cross_attention", True),
        ("hidden_act", "quick_gelu"), ("model_type", "bert"), ("tie_word_embeddings", False),
    ):
        with pytest.raises(ValueError, match=name):
            hf_electra.from_hf_config(dict(hf, **{name: value}))
    for name, value in (("embedding_size", 32), ("num_layer_groups", 1), ("positions_after_padding", True)):
        with pytest.raises(ValueError, match=name):
            hf_electra.to_hf_config(dataclasses.replace(ELECTRA, **{name: value}))
    with pytest.raises(ValueError, match="role"):
        hf_electra.build_hf_model(ELECTRA, "critic")
    with pytest.raises(KeyError, match="discriminator_predictions"):
        hf_electra.hf_to_params(random_hf_model(ELECTRA, "generator").state_dict(), ELECTRA, "discriminator")
