"""Prompt tuning and P-tuning on tiny T5, BART, GPT-2 and BERT: a prompt set to the embeddings of real tokens computes
what the base model computes on those tokens prepended; P-tuning's prompt encoder against float64 numpy; the
initialisations; scanned layers; refusals."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_test_models import init_params
from peft_test_models import ENCODER_DECODERS, MODELS, input_field, outputs, redrawn, token_inputs, without

from ptmjax.adapt.p_tuning import p_tuning
from ptmjax.adapt.prompt_tuning import PROMPT_PARAMS, prompt_tuning
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.layers import layer_stack

PROMPT_IDS = np.array([7, 8, 9], np.int32)


def prompt_scope(params: dict, name: str) -> dict:
    """The parameter dict that holds the prompt: the encoder of T5 and BART, else the top level."""
    return params["encoder"] if name in ENCODER_DECODERS else params


def token_table(params: dict, name: str) -> jax.Array:
    return (params["embeddings"] if name == "bert" else params)["token_embedder"]["embedding"]


def prepended(name: str) -> dict[str, jax.Array]:
    """The model's token input with PROMPT_IDS in front of every row."""
    tokens = token_inputs(name)
    return {input_field(name): jnp.concatenate([jnp.broadcast_to(PROMPT_IDS, (len(tokens), 3)), tokens], axis=1)}


@pytest.mark.parametrize("name", ["t5", "bart", "gpt2", "bert"])
def test_a_prompt_of_token_embeddings_computes_the_base_model_on_those_tokens_prepended(name):
    model = prompt_tuning(MODELS[name], length=len(PROMPT_IDS))
    params = init_params(model)
    assert jnp.shape(prompt_scope(params, name)["soft_prompt"]) == (3, 32)
    prompt_scope(params, name)["soft_prompt"] = token_table(params, name)[PROMPT_IDS]
    got = outputs(model, params, name)
    want = outputs(MODELS[name], without(params, PROMPT_PARAMS), name, **prepended(name))
    if name not in ENCODER_DECODERS:  # GPT-2 and the encoder drop the prompt's outputs: logits align with targets
        want = want[:, 3:]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_p_tuning_is_prompt_tuning_with_the_prompt_encoders_output_in_float64():
    tuned = p_tuning(MODELS["t5"], length=3, hidden=8)
    params = redrawn(init_params(tuned), r"prompt_encoder_\w+_bias$")  # non-zero biases too
    p = {k.removeprefix("prompt_encoder_"): np.asarray(v, np.float64) for k, v in params["encoder"].items()
         if k.startswith("prompt_encoder_")}
    assert p["embedding"].shape == (3, 32) and p["wi"].shape == (32, 8) and p["wo"].shape == (8, 32)
    prompt = np.maximum(p["embedding"] @ p["wi"] + p["wi_bias"], 0) @ p["wo"] + p["wo_bias"]
    plain = without(params, PROMPT_PARAMS)
    plain["encoder"]["soft_prompt"] = jnp.asarray(prompt, jnp.float32)
    want = outputs(prompt_tuning(MODELS["t5"], length=3), plain, "t5")
    np.testing.assert_allclose(outputs(tuned, params, "t5"), want, rtol=1e-5, atol=1e-5)


def test_vocab_init_copies_token_embeddings_and_uniform_init_stays_in_half_a_unit():
    params = init_params(prompt_tuning(MODELS["gpt2"], length=5, init="vocab"))
    table = np.asarray(params["token_embedder"]["embedding"])
    for row in np.asarray(params["soft_prompt"]):
        assert np.any(np.all(table == row, axis=1))
    uniform = np.asarray(init_params(prompt_tuning(MODELS["gpt2"], length=5, init="uniform"))["soft_prompt"])
    assert np.abs(uniform).max() <= 0.5 and uniform.std() > 0.2


def test_scanned_layers_compute_what_unscanned_ones_do():
    plain = prompt_tuning(MODELS["gpt2"], length=3)
    scanned_base = MODELS["gpt2"].clone(config=dataclasses.replace(MODELS["gpt2"].config, scan_layers=True))
    params = init_params(plain)
    stacked = layer_stack.scan(params, scanned_base.config)
    got = outputs(prompt_tuning(scanned_base, length=3), stacked, "gpt2")
    np.testing.assert_allclose(got, outputs(plain, params, "gpt2"), rtol=1e-5, atol=1e-5)


def test_cached_decoding_of_a_prompt_tuned_gpt2_refuses_scanned_layers_and_too_long_decodes():
    scanned = MODELS["gpt2"].clone(config=dataclasses.replace(MODELS["gpt2"].config, scan_layers=True))
    batch = {"decoder_input_tokens": np.array([[5, 6, 7]], np.int32)}
    ids = GenerationIds(eos_token_id=1, pad_token_id=0, decoder_start_token_id=0)
    model = prompt_tuning(scanned, length=3)
    with pytest.raises(ValueError, match=r"set GPT2Config.scan_layers = False and remat_policy = 'none' to decode"):
        model_api(model).predict(init_params(model), batch, DecodeConfig(max_decode_length=4), ids)
    model = prompt_tuning(MODELS["gpt2"], length=3)
    with pytest.raises(ValueError, match=r"needs 33 positions, more than GPT2Config.max_length = 32"):
        model_api(model).predict(init_params(model), batch, DecodeConfig(max_decode_length=27), ids)


@pytest.mark.parametrize(("make", "message"), [
    (lambda m: prompt_tuning(m, length=0), "PromptSettings.length must be a positive int, got 0"),
    (lambda m: prompt_tuning(m, init="zeros"), "prompt_tuning init='zeros' is unknown"),
    (lambda m: p_tuning(m, hidden=0), "PTuningSettings.hidden must be a positive int, got 0"),
    (lambda m: prompt_tuning(prompt_tuning(m)), "already has prompt tuning"),
])
def test_bad_settings_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make(MODELS["gpt2"])
