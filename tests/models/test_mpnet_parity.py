"""MPNet parity with Hugging Face transformers' MPNetForMaskedLM (random tiny models) and lossless conversion.

Inputs are padded with 1 (which also shifts the absolute positions) and long enough for the relative
position buckets past the exact ones (distances 8 to 30); padded positions are not compared.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    assert_same_state_dict,
    count_params,
    hf_meta_param_count,
    load_gin_config,
    numpy_boxed_variables,
    perturbed_hf_model,
)

from ptmjax.models.mpnet import MPNet, MPNetConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_mpnet  # noqa: E402

MPNET = MPNetConfig(
    vocab_size=101, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=40, pad_token_id=1,
    positions_after_padding=True, dropout_rate=0.0, attention_dropout_rate=0.0, layer_norm_epsilon=1e-5,
)
CONFIGS = {
    "mpnet": MPNET,
    "mpnet_odd_heads_5_tanh_gelu": dataclasses.replace(MPNET, d_model=40, num_heads=5, activation="gelu", num_layers=3),
}


def padded_batch(config: MPNetConfig) -> np.ndarray:
    """Tokens [3, 31]: rows 1 and 2 padded (with 1) from 17 and 5."""
    tokens = np.random.default_rng(0).integers(3, config.vocab_size, (3, 31))
    tokens[1, 17:] = tokens[2, 5:] = config.pad_token_id
    return tokens


def hf_and_ours(config: MPNetConfig, tokens: np.ndarray):
    hf_model = perturbed_hf_model(lambda: hf_mpnet.build_hf_model(config))
    params = hf_mpnet.hf_to_params(hf_model.state_dict(), config)
    with torch.no_grad():
        hf_out = hf_model(torch.tensor(tokens), attention_mask=torch.tensor((tokens != 1).astype(np.int64)),
                          output_hidden_states=True)
    model = MPNet(config)
    logits = jax.jit(lambda p, t: model.apply(p, t).mlm_logits)(params, jnp.asarray(tokens))
    hidden = jax.jit(lambda p, t: model.apply(p, t, method=model.encode))(params, jnp.asarray(tokens))
    return hf_model, params, hf_out, logits, hidden


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mlm_logits_and_hidden_states_match_transformers_with_padding(name):
    config = CONFIGS[name]
    tokens = padded_batch(config)
    hf_model, _, hf_out, logits, hidden = hf_and_ours(config, tokens)
    assert hf_mpnet.from_hf_config(hf_model.config) == config
    valid = tokens != config.pad_token_id
    hidden_diff = np.abs(np.asarray(hidden) - hf_out.hidden_states[-1].numpy())[valid].max()
    logit_diff = np.abs(np.asarray(logits) - hf_out.logits.numpy())[valid].max()
    print(name, f"hidden {hidden_diff:.2e} logits {logit_diff:.2e}")
    assert logits.dtype == jnp.float32
    assert hidden_diff < 1e-5 and logit_diff < 1e-5


def test_the_relative_bias_is_learned_and_used():
    """A model whose relative bias table is zeroed computes other logits: the mapping is not vacuous."""
    tokens = padded_batch(MPNET)
    _, params, _, logits, _ = hf_and_ours(MPNET, tokens)
    flat = jax.tree.map(np.asarray, params)
    flat["params"]["relative_position_bias"]["rel_embedding"] = np.zeros_like(
        flat["params"]["relative_position_bias"]["rel_embedding"])
    zeroed = MPNet(MPNET).apply(flat, jnp.asarray(tokens)).mlm_logits
    assert np.abs(np.asarray(zeroed) - np.asarray(logits)).max() > 1e-2


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in perturbed_hf_model(lambda: hf_mpnet.build_hf_model(config)).state_dict().items()}
    back = hf_mpnet.params_to_hf(hf_mpnet.hf_to_params(state, config), config)
    assert_same_state_dict(back, state)


def test_boxed_init_params_export_and_reimport():
    variables = numpy_boxed_variables(lambda: MPNet(MPNET).init(jax.random.PRNGKey(0), jnp.full((1, 4), 5, jnp.int32)))
    reloaded = hf_mpnet.hf_to_params(hf_mpnet.params_to_hf(variables, MPNET), MPNET)
    jax.tree.map(np.testing.assert_array_equal, reloaded, jax.tree.map(np.asarray, nn.meta.unbox(variables)))


def test_configs_transformers_computes_otherwise_are_refused():
    hf_config = hf_mpnet.to_hf_config(MPNET).to_dict()
    with pytest.raises(ValueError, match="relative_attention_num_buckets=16"):
        hf_mpnet.from_hf_config({**hf_config, "relative_attention_num_buckets": 16})
    for change, message in (({"pad_token_id": 0}, "pad_token_id=0"), ({"type_vocab_size": 2}, "type_vocab_size=2"),
                            ({"relative_attention_max_distance": 64}, "relative_attention_max_distance=64")):
        with pytest.raises(ValueError, match=message):
            hf_mpnet.to_hf_config(dataclasses.replace(MPNET, **change))


@pytest.mark.parametrize("name", ["mpnet_tiny", "mpnet_base"])
def test_gin_configs_have_the_parameters_of_their_transformers_model(name):
    config = load_gin_config(name, MPNetConfig)
    ours = count_params(lambda: MPNet(config).init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32)))
    assert ours == hf_meta_param_count("hf_mpnet", config)  # mpnet_base: 109,518,527
