"""Cached decoding gives exactly the tokens of uncached full-sequence argmax decoding, for every generative
family and layer option (MoE, prefix LM, bf16, remat, scanned layers)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from decoding_helpers import IDS, MODELS, peaked_params, prompt_batch, uncached_greedy

from ptmjax.decoding import DecodeConfig
from ptmjax.layers import layer_stack
from ptmjax.models import GPT2

LENGTH = 7
GREEDY = DecodeConfig(max_decode_length=LENGTH)


def assert_matches_uncached(module, params, reference_module, reference_params, jit_predict, prefix_lm=False):
    batch = prompt_batch(module, prefix_lm)
    out = jit_predict(module)(params, batch, GREEDY, IDS)
    tokens, scores = uncached_greedy(reference_module, reference_params, batch, LENGTH)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), tokens)
    np.testing.assert_allclose(np.asarray(out.scores[:, 0]), scores, rtol=1e-4, atol=1e-4)
    return tokens


COVERED_ELSEWHERE = {"t5_1_0", "mbart", "gpt2_moe"}  # Hugging Face parity (T5 v1.0, mBART) and Switch cover them
ALL_MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in COVERED_ELSEWHERE else n for n in sorted(MODELS)]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_cached_greedy_equals_uncached_argmax(name, jit_predict):
    module = MODELS[name]
    params = peaked_params(module)
    tokens = assert_matches_uncached(module, params, module, params, jit_predict)
    assert len(set(tokens.ravel().tolist())) >= 3, "degenerate decode: the test would not see a wrong cache"


def test_prefix_lm_prompt_is_bidirectional(jit_predict):
    module = MODELS["gpt2"]
    params = peaked_params(module)
    tokens = assert_matches_uncached(module, params, module, params, jit_predict, prefix_lm=True)
    causal = jit_predict(module)(params, prompt_batch(module), GREEDY, IDS).tokens[:, 0]
    assert not np.array_equal(tokens, np.asarray(causal)), "the prompt's attention made no difference"


def test_eos_ends_a_row_and_pads_the_rest(jit_predict):
    """With EOS set to a token the model emits mid-sequence, that row stops there and the rest is padding."""
    module = MODELS["t5_1_1"]
    params = peaked_params(module)
    free = np.asarray(jit_predict(module)(params, prompt_batch(module), GREEDY, IDS).tokens[:, 0])
    eos = int(free[0, 2])
    ids = dataclasses.replace(IDS, eos_token_id=eos, pad_token_id=0)
    out = np.asarray(jit_predict(module)(params, prompt_batch(module), GREEDY, ids).tokens[:, 0])
    stop = list(free[0]).index(eos)
    np.testing.assert_array_equal(out[0, : stop + 1], free[0, : stop + 1])
    assert (out[0, stop + 1 :] == 0).all()
    reference, _ = uncached_greedy(module, params, prompt_batch(module), LENGTH, ids)
    np.testing.assert_array_equal(out, reference)


@pytest.mark.parametrize(
    "name", ["t5_1_1", "gpt2", *(pytest.param(name, marks=pytest.mark.slow) for name in ("bart", "switch"))]
)
def test_scanned_and_rematerialised_layers_decode_the_same(name, jit_predict):
    plain = MODELS[name]
    params = peaked_params(plain)
    config = dataclasses.replace(plain.config, scan_layers=True, remat_policy="full")
    scanned = plain.clone(config=config)
    assert_matches_uncached(scanned, layer_stack.scan(params, config), plain, params, jit_predict)


ON_GPU = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's fused attention runs on an NVIDIA GPU")


@pytest.mark.parametrize("name, kernel", [
    ("t5_1_1", "einsum"), pytest.param("gpt2", "einsum", marks=pytest.mark.slow),
    pytest.param("t5_1_1", "cudnn", marks=ON_GPU), pytest.param("gpt2", "cudnn", marks=ON_GPU),
])
def test_bfloat16_activations_decode_like_uncached_bfloat16(name, kernel, jit_predict):
    """The cache holds bf16 keys and values; the uncached bf16 model picks the same tokens (with cuDNN's
    attention too, on a GPU: the cache's one-query steps against whole unpacked sequences)."""
    plain = MODELS[name]
    module = plain.clone(config=dataclasses.replace(plain.config, dtype="bfloat16", attention_kernel=kernel))
    params = peaked_params(plain)
    out = jit_predict(module)(params, prompt_batch(module), GREEDY, IDS)
    assert out.tokens.dtype == np.int32
    tokens, scores = uncached_greedy(module, params, prompt_batch(module), LENGTH)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), tokens)
    np.testing.assert_allclose(np.asarray(out.scores[:, 0]), scores, rtol=0.05, atol=0.1)


def test_gpt2_prompt_and_decode_must_fit_the_position_table():
    module = MODELS["gpt2"]
    params = peaked_params(module)
    from ptmjax.families.model_api import model_api

    too_long = DecodeConfig(max_decode_length=module.config.max_length)
    with pytest.raises(ValueError, match="exceeds the learned position table"):
        jax.eval_shape(lambda p: model_api(module).predict(p, prompt_batch(module), too_long, IDS), params)
    assert isinstance(module, GPT2)
