"""Greedy decoding of a LoRA model (ModelApi.predict: the cached encode/decode and hidden_states/logits calls)
equals decoding its merged parameters with the plain model."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from lora_test_models import BASE_MODELS, init_params, with_random_lora, without_lora

from ptmjax.adapt.lora import base_model, lora
from ptmjax.adapt.lora_merge import merge_lora
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api

IDS = GenerationIds(eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
PROMPTS = np.array([[5, 6, 7, 8], [9, 10, 0, 0], [11, 0, 0, 0]], np.int32)  # right-padded with 0


def greedy(model, params, batch):
    return jax.jit(model_api(model).predict, static_argnums=(2, 3))(params, batch, DecodeConfig(max_decode_length=8),
                                                                   IDS)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_greedy_decoding_of_a_lora_model_equals_the_merged_model(name):
    model = lora(BASE_MODELS[name], rank=4, alpha=16.0)
    params = with_random_lora(init_params(model), scale=0.5)
    if name == "gpt2":
        batch = {"decoder_input_tokens": PROMPTS, "decoder_segment_ids": (PROMPTS > 0).astype(np.int32)}
    else:
        batch = {"encoder_input_tokens": PROMPTS}
    adapted, merged = greedy(model, params, batch), greedy(base_model(model), merge_lora(params, model), batch)
    unadapted = greedy(BASE_MODELS[name], without_lora(params), batch)
    assert np.abs(np.asarray(adapted.scores) - np.asarray(unadapted.scores)).max() > 0.1  # the updates are applied
    np.testing.assert_array_equal(np.asarray(adapted.tokens), np.asarray(merged.tokens))
    np.testing.assert_allclose(np.asarray(adapted.scores), np.asarray(merged.scores), rtol=1e-5, atol=1e-5)
