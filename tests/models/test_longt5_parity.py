"""LongT5 (local and transient-global) against Hugging Face transformers' LongT5ForConditionalGeneration:
equal logits on padded rows whose lengths are not multiples of the block sizes, lossless conversion both ways.

Reference models are built from configs with random weights (nothing is downloaded); padded decoder
positions are excluded from the comparison.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_state_dict, perturbed_t5_hf_model, t5_logit_diff, t5_padded_batch

from ptmjax.convert.hf_longt5 import build_hf_model, from_hf_config, hf_to_params, params_to_hf, to_hf_config
from ptmjax.layers.transient_global import global_block_ids
from ptmjax.models.longt5 import LongT5, LongT5Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LOCAL = LongT5Config(
    vocab_size=150, d_model=32, num_heads=4, head_dim=8, d_ff=48, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0, relative_attention_num_buckets=16,
    relative_attention_max_distance=20, encoder_attention_type="local", local_radius=4, global_block_size=3,
)
CONFIGS = {
    "local": LOCAL,
    "transient_global": dataclasses.replace(LOCAL, encoder_attention_type="transient-global"),
    "transient_global_tied": dataclasses.replace(
        LOCAL, encoder_attention_type="transient-global", tie_embeddings=True, ffn_activations=("relu",),
        global_block_size=4,
    ),
}


def random_hf_model(config: LongT5Config):
    """Relative biases redrawn from N(0, 1): HF's are small, which would hide a wrong mapping."""
    return perturbed_t5_hf_model(lambda: build_hf_model(config), relative_bias_std=1.0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(name):
    """Encoder rows of 23 tokens (not a multiple of block 5 nor of 3 or 4), padded at 17 and 2; decoder rows of
    7, 5 and 7."""
    config = CONFIGS[name]
    model = random_hf_model(config)
    assert from_hf_config(model.config) == config
    params = hf_to_params(model.state_dict(), config)
    assert t5_logit_diff(LongT5(config), params, model, t5_padded_batch(config.vocab_size, (23, 17, 2),
                                                                         (7, 5, 7))) < 1e-4


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in random_hf_model(config).state_dict().items()}
    assert_same_state_dict(params_to_hf(hf_to_params(state, config), config), state)
    assert from_hf_config(to_hf_config(config)) == config


def test_local_attention_sees_exactly_the_radius():
    """One layer: changing the token at distance radius + 1 leaves a position's encoding as it was; at radius it
    does not."""
    config = dataclasses.replace(CONFIGS["local"], num_encoder_layers=1)
    params = hf_to_params(random_hf_model(config).state_dict(), config)
    tokens = np.random.default_rng(1).integers(1, config.vocab_size, (1, 23))
    encode = jax.jit(lambda t: LongT5(config).apply(params, t, method=LongT5.encode))
    base = np.asarray(encode(jnp.asarray(tokens)))
    for distance, changes in ((config.local_radius + 1, False), (config.local_radius, True)):
        moved = tokens.copy()
        moved[0, 10 + distance] = moved[0, 10 + distance] % (config.vocab_size - 1) + 1
        delta = np.abs(np.asarray(encode(jnp.asarray(moved)))[0, 10] - base[0, 10]).max()
        assert (delta > 1e-6) == changes, (distance, delta)


def test_global_block_ids_match_transformers():
    make = transformers.models.longt5.modeling_longt5._make_global_fixed_block_ids
    rng = np.random.default_rng(2)
    for size in (2, 3, 5):
        lengths = rng.integers(0, 17, 6)
        valid = np.arange(17)[None] < lengths[:, None]
        ref_ids, ref_exists = make(torch.tensor(valid, dtype=torch.float32), size)
        ids, exists = global_block_ids(jnp.asarray(valid), size)
        np.testing.assert_array_equal(np.asarray(ids), ref_ids.numpy())
        np.testing.assert_array_equal(np.asarray(exists), ref_exists.numpy().astype(bool))
