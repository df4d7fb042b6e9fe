"""GPT-2 parity with Hugging Face transformers (random tiny models), masks, and lossless conversion.

The prefix-LM and packing masks are checked against HF given the same mask,
built here independently as a 4-D additive mask.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_state_dict

from ptmjax.models import GPT2, GPT2Config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ptmjax.convert import hf_gpt2  # noqa: E402

BASE = GPT2Config(
    vocab_size=101, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=24,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)
CONFIGS = {
    "base": BASE,
    "odd_heads_3": dataclasses.replace(BASE, d_model=24, num_heads=3, d_ff=40, num_layers=3),
    "one_head_exact_gelu": dataclasses.replace(BASE, num_heads=1, activation="gelu_exact", layer_norm_epsilon=1e-6),
}


def random_hf_model(config: GPT2Config):
    torch.manual_seed(0)
    model = hf_gpt2.build_hf_model(config).eval()
    with torch.no_grad():  # HF inits LayerNorms to (1, 0) and biases to 0: perturb so a wrong mapping shows
        for name, param in model.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                param.add_(0.2 * torch.randn_like(param))
    return model


def _run(config, params, tokens, **kwargs):
    def fn(p, t, kw):
        model = GPT2(config)
        return model.apply(p, t, **kw), model.apply(p, t, **kw, method=GPT2.hidden_states)

    logits, hidden = jax.jit(fn)(params, jnp.asarray(tokens), {k: jnp.asarray(v) for k, v in kwargs.items()})
    return np.asarray(logits), np.asarray(hidden)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_hidden_match_transformers_with_padding(name):
    config = CONFIGS[name]
    model = random_hf_model(config)
    assert hf_gpt2.from_hf_config(model.config) == config
    params = hf_gpt2.hf_to_params(model.state_dict(), config)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, (3, 20))
    valid = np.ones_like(tokens)
    valid[1, 13:] = 0
    valid[2, 5:] = 0
    tokens[valid == 0] = 0
    with torch.no_grad():
        out = model(torch.tensor(tokens), attention_mask=torch.tensor(valid), output_hidden_states=True)
    logits, hidden = _run(config, params, tokens, decoder_segment_ids=valid)
    assert logits.dtype == np.float32 and logits.shape == out.logits.shape
    keep = valid.astype(bool)
    logit_diff = np.abs(logits - out.logits.numpy())[keep].max()
    hidden_diff = np.abs(hidden - out.hidden_states[-1].numpy())[keep].max()
    print(f"gpt2 {name}: max |logit diff| {logit_diff:.2e}, max |hidden diff| {hidden_diff:.2e}")
    assert logit_diff < 1e-4 and hidden_diff < 1e-4


def reference_mask(prefix_lengths, segment_ids):
    """Independent construction: causal, or both inside the row's prefix; same nonzero segment."""
    batch, length = segment_ids.shape
    mask = np.zeros((batch, 1, length, length), bool)
    for b in range(batch):
        for q in range(length):
            for k in range(length):
                visible = k <= q or (q < prefix_lengths[b] and k < prefix_lengths[b])
                mask[b, 0, q, k] = visible and segment_ids[b, q] == segment_ids[b, k] != 0
    return mask


def test_prefix_lm_and_packing_match_transformers_given_the_same_mask():
    config = CONFIGS["odd_heads_3"]
    model = random_hf_model(config)
    params = hf_gpt2.hf_to_params(model.state_dict(), config)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, config.vocab_size, (3, 16))
    # Row 0: one example, prefix 6. Row 1: bidirectional throughout. Row 2: two packed examples + padding;
    # the bidirectional prefix is the first 4 positions (inside segment 1).
    segments = np.array([[1] * 16, [1] * 16, [1] * 7 + [2] * 6 + [0] * 3])
    positions = np.array([list(range(16)), list(range(16)), list(range(7)) + list(range(6)) + [0] * 3])
    prefix_lengths = [6, 16, 4]
    causal_attention = np.array([[int(i < n) for i in range(16)] for n in prefix_lengths])
    mask = reference_mask(prefix_lengths, segments)
    with torch.no_grad():
        ref = model(
            torch.tensor(tokens), position_ids=torch.tensor(positions),
            attention_mask=torch.tensor(np.where(mask, 0.0, -1e9), dtype=torch.float32),
        ).logits.numpy()
    logits, _ = _run(
        config, params, tokens, decoder_segment_ids=segments, decoder_positions=positions,
        decoder_causal_attention=causal_attention,
    )
    keep = segments > 0
    diff = np.abs(logits - ref)[keep].max()
    print(f"gpt2 prefix-LM + packing: max |logit diff| {diff:.2e}")
    assert diff < 1e-4
    causal, _ = _run(config, params, tokens, decoder_segment_ids=segments, decoder_positions=positions)
    assert np.abs(causal - logits)[keep].max() > 1e-3  # the prefix really changes the model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_conversion_round_trip_is_identity(name):
    config = CONFIGS[name]
    state = {k: v.numpy() for k, v in random_hf_model(config).state_dict().items()}
    back = hf_gpt2.params_to_hf(hf_gpt2.hf_to_params(state, config), config)
    assert_same_state_dict(back, state)


def test_boxed_init_params_export_and_reimport():
    config = CONFIGS["odd_heads_3"]
    variables = jax.jit(GPT2(config).init)(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
    reloaded = hf_gpt2.hf_to_params(hf_gpt2.params_to_hf(variables, config), config)
    jax.tree.map(np.testing.assert_array_equal, reloaded, jax.tree.map(np.asarray, nn.meta.unbox(variables)))


def test_config_round_trip_and_unsupported_values_are_named():
    for config in CONFIGS.values():
        assert hf_gpt2.from_hf_config(hf_gpt2.to_hf_config(config)) == config
    hf = hf_gpt2.to_hf_config(BASE).to_dict()
    for name, value in (
        ("scale_attn_by_inverse_layer_idx", True), ("add_cross_attention", True),
        ("activation_function", "quick_gelu"), ("tie_word_embeddings", False), ("scale_attn_weights", False),
    ):
        with pytest.raises(ValueError, match=name):
            hf_gpt2.from_hf_config(dict(hf, **{name: value}))
    with pytest.raises(ValueError, match="resid_pdrop"):
        hf_gpt2.from_hf_config(dict(hf, resid_pdrop=0.1, embd_pdrop=0.0))
    with pytest.raises(KeyError, match="transformer.h.2"):
        hf_gpt2.hf_to_params(random_hf_model(BASE).state_dict(), dataclasses.replace(BASE, num_layers=3))
    with pytest.raises(ValueError, match="num_heads"):
        GPT2Config(vocab_size=10, d_model=30, num_heads=4, num_layers=1, d_ff=8, max_length=8)
    with pytest.raises(ValueError, match="max_length"):
        GPT2(BASE).init(jax.random.PRNGKey(0), jnp.ones((1, BASE.max_length + 1), jnp.int32))
