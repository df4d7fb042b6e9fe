"""Logit parity with Hugging Face transformers T5 and mT5, and lossless weight conversion both ways.

Reference models are built from configs with random weights (nothing is
downloaded); padded positions are excluded from the comparison.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_state_dict, perturbed_t5_hf_model, t5_logit_diff, t5_padded_batch

from ptmjax.convert.hf_t5 import build_hf_model, from_hf_config, hf_to_params, params_to_hf, to_hf_config
from ptmjax.layers.relative_position import relative_position_bucket
from ptmjax.models import EncoderDecoder, T5Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = T5Config(
    vocab_size=200, d_model=32, num_heads=4, head_dim=8, d_ff=48, num_encoder_layers=2, num_decoder_layers=3,
    ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
CONFIGS = {
    "v1_0_relu_tied": BASE,
    "v1_1_gated_gelu_untied": dataclasses.replace(BASE, ffn_activations=("gelu", "linear"), tie_embeddings=False),
    "odd_heads_inner_dim_ne_d_model": dataclasses.replace(
        BASE, num_heads=3, head_dim=12, ffn_activations=("gelu", "linear"), tie_embeddings=False
    ),
    "mt5": dataclasses.replace(  # MT5ForConditionalGeneration
        BASE, ffn_activations=("gelu", "linear"), tie_embeddings=False, hf_model_type="mt5"
    ),
}


def random_hf_model(config: T5Config):
    return perturbed_t5_hf_model(lambda: build_hf_model(config))


def padded_batch(config: T5Config):
    """Encoder rows of 40, 30 and 7 tokens; decoder rows of 12, 9 and 4."""
    return t5_padded_batch(config.vocab_size, (40, 30, 7), (12, 9, 4))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(name):
    config = CONFIGS[name]
    model = random_hf_model(config)
    assert from_hf_config(model.config) == config
    params = hf_to_params(model.state_dict(), config)
    assert t5_logit_diff(EncoderDecoder(config), params, model, padded_batch(config)) < 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in random_hf_model(config).state_dict().items()}
    back = params_to_hf(hf_to_params(state, config), config)
    assert_same_state_dict(back, state)


def test_params_to_hf_accepts_boxed_init_params():
    config = CONFIGS["v1_1_gated_gelu_untied"]
    tokens = jnp.ones((1, 4), jnp.int32)
    variables = jax.jit(EncoderDecoder(config).init)(jax.random.PRNGKey(1), tokens, tokens)
    state = params_to_hf(variables, config)
    reloaded = hf_to_params(state, config)
    unboxed = jax.tree.map(np.asarray, nn.meta.unbox(variables))
    jax.tree.map(np.testing.assert_array_equal, reloaded, unboxed)


def test_relative_position_bucket_matches_transformers():
    relative = torch.arange(-300, 301)[None, :] - torch.zeros(1, 1, dtype=torch.long)
    bucket_fn = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    for bidirectional in (True, False):
        for num_buckets, max_distance in ((32, 128), (16, 40)):
            ref = bucket_fn(relative, bidirectional, num_buckets, max_distance).numpy()
            ours = np.asarray(
                relative_position_bucket(jnp.asarray(relative.numpy()), bidirectional, num_buckets, max_distance)
            )
            np.testing.assert_array_equal(ours, ref)


def test_config_round_trip_and_legacy_dict():
    for config in CONFIGS.values():
        assert from_hf_config(to_hf_config(config)) == config
    legacy = dict(to_hf_config(CONFIGS["v1_1_gated_gelu_untied"]).to_dict(), tie_word_embeddings=False)
    legacy.pop("scale_decoder_outputs", None)
    assert from_hf_config(legacy) == CONFIGS["v1_1_gated_gelu_untied"]


def test_unsupported_hf_values_are_named():
    hf = to_hf_config(BASE).to_dict()
    with pytest.raises(ValueError, match="feed_forward_proj='gated-silu'"):
        from_hf_config(dict(hf, feed_forward_proj="gated-silu"))
    with pytest.raises(ValueError, match="ffn_activations"):
        to_hf_config(dataclasses.replace(BASE, ffn_activations=("silu", "linear")))
    wrong = dataclasses.replace(BASE, num_encoder_layers=3)
    with pytest.raises(KeyError, match="encoder.block.2"):
        hf_to_params(random_hf_model(BASE).state_dict(), wrong)


def test_init_scales_match_t5_initialisation():
    """Our variance-scaling init gives the per-weight std of HF's T5 `_init_weights` (factor 1)."""
    config = dataclasses.replace(BASE, d_model=64, d_ff=256, ffn_activations=("gelu", "linear"), tie_embeddings=False)
    tokens = jnp.ones((1, 4), jnp.int32)
    params = nn.meta.unbox(jax.jit(EncoderDecoder(config).init)(jax.random.PRNGKey(3), tokens, tokens))["params"]
    layer = params["decoder"]["layers_0"]
    e, h, d, f = config.d_model, config.num_heads, config.head_dim, config.d_ff
    expected = {
        "embedding": (params["token_embedder"]["embedding"], 1.0),
        "q": (layer["self_attention"]["query"]["kernel"], (e * d) ** -0.5),
        "k": (layer["encoder_decoder_attention"]["key"]["kernel"], e**-0.5),
        "v": (layer["self_attention"]["value"]["kernel"], e**-0.5),
        "o": (layer["self_attention"]["out"]["kernel"], (h * d) ** -0.5),
        "wi_0": (layer["mlp"]["wi_0"]["kernel"], e**-0.5),
        "wo": (layer["mlp"]["wo"]["kernel"], f**-0.5),
    }
    for name, (weight, std) in expected.items():
        assert abs(float(np.std(weight)) / std - 1.0) < 0.1, (name, float(np.std(weight)), std)


def test_a_transformers_5_untied_t5_saved_as_tied_and_unscaled_imports_exactly(tmp_path):
    """transformers 5 turns `tie_word_embeddings=False` into tied + `scale_decoder_outputs=False` and saves no
    `lm_head.weight`: its logits are the shared embedding without the d_model**-0.5 scale."""
    import json

    from ptmjax import cli
    from ptmjax.convert import hf

    torch.manual_seed(1)
    hf_config = transformers.T5Config(
        vocab_size=200, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
    )
    reference = transformers.T5ForConditionalGeneration(hf_config).eval()
    reference.save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (saved["tie_word_embeddings"], saved["scale_decoder_outputs"]) == (True, False)
    model, params = hf.load(str(tmp_path / "hf"))
    assert model.config == CONFIGS["v1_1_gated_gelu_untied"]
    np.testing.assert_array_equal(params["decoder"]["logits_dense"]["kernel"], params["token_embedder"]["embedding"].T)
    assert t5_logit_diff(model, {"params": params}, reference, padded_batch(model.config)) < 1e-4
    assert cli.main(["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(tmp_path / "imported")]) == 0
    hf.save(model, params, str(tmp_path / "exported"))  # and back: HF gets its own lm_head, equal logits
    exported = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "exported").eval()
    assert t5_logit_diff(model, {"params": params}, exported, padded_batch(model.config)) < 1e-4
