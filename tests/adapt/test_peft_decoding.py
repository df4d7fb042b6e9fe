"""Greedy decoding (ModelApi.predict: the cached encode/decode and hidden_states/logits calls) with adapters, prompt
tuning, P-tuning and prefix tuning equals an uncached greedy loop over the whole model, or for prompt tuning the
base model decoding with the prompt's tokens in front of the input (GPT-2's prompt taken as keys and values)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_test_models import init_params
from peft_test_models import ENCODER_DECODERS, MODELS, redrawn, uncached_greedy, without

from ptmjax.adapt.adapters import ADAPTER_PARAMS, adapters
from ptmjax.adapt.p_tuning import p_tuning
from ptmjax.adapt.prefix_tuning import PREFIX_PARAMS, prefix_tuning
from ptmjax.adapt.prompt_tuning import PROMPT_PARAMS, prompt_tuning
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api

IDS = GenerationIds(eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
PROMPTS = np.array([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], np.int32)
STEPS = 6
METHODS = {
    "adapters": (lambda m: adapters(m, bottleneck=4), ADAPTER_PARAMS),
    "p_tuning": (lambda m: p_tuning(m, length=3, hidden=8), PROMPT_PARAMS),
    "prefix": (lambda m: prefix_tuning(m, length=3, hidden=8), PREFIX_PARAMS),
}


def greedy(model, params, name: str, prompts: np.ndarray) -> np.ndarray:
    batch = {"encoder_input_tokens" if name in ENCODER_DECODERS else "decoder_input_tokens": prompts}
    config = DecodeConfig(max_decode_length=STEPS)
    out = jax.jit(model_api(model).predict, static_argnums=(2, 3))(params, batch, config, IDS)
    return np.asarray(out.tokens[:, 0])


@pytest.mark.parametrize(("method", "name"), [
    ("adapters", "t5"), pytest.param("adapters", "gpt2", marks=pytest.mark.slow),  # -m slow: adapters' hooks are
    pytest.param("adapters", "bart", marks=pytest.mark.slow), ("p_tuning", "t5"), ("p_tuning", "gpt2"),  # family-blind
    ("prefix", "t5"), ("prefix", "gpt2"), ("prefix", "bart"),
])
@pytest.mark.slow
def test_greedy_decoding_equals_the_uncached_loop(method, name):
    make, pattern = METHODS[method]
    model = make(MODELS[name])
    params = redrawn(init_params(model), pattern, scale=0.5)
    got = greedy(model, params, name, PROMPTS)
    assert not np.array_equal(got, greedy(MODELS[name], without(params, pattern), name, PROMPTS))  # it matters
    np.testing.assert_array_equal(got, uncached_greedy(model, params, name, PROMPTS, STEPS, IDS.eos_token_id))


@pytest.mark.parametrize("name", [*ENCODER_DECODERS, "gpt2"])
def test_greedy_decoding_of_a_prompt_tuned_model_equals_the_base_model_with_the_prompts_tokens_in_front(name):
    prompt_ids = np.array([20, 21, 22], np.int32)
    model = prompt_tuning(MODELS[name], length=3)
    params = init_params(model)
    (params["encoder"] if name in ENCODER_DECODERS else params)["soft_prompt"] = (
        params["token_embedder"]["embedding"][prompt_ids]
    )
    prepended = np.concatenate([np.broadcast_to(prompt_ids, (len(PROMPTS), 3)), PROMPTS], axis=1)
    want = greedy(MODELS[name], without(params, PROMPT_PARAMS), name, prepended)
    np.testing.assert_array_equal(greedy(model, params, name, PROMPTS), want)
    assert not np.array_equal(want, greedy(MODELS[name], without(params, PROMPT_PARAMS), name, PROMPTS))
    assert jnp.shape(want) == (len(PROMPTS), STEPS)
