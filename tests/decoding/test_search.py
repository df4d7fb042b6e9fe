"""The search algorithms: their limits equal greedy, beam search beats it, samples follow the model's
distribution and its filters, forced tokens and EOS behave, and bad settings get clear errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_helpers import IDS, MODELS, peaked_params, prompt_batch

from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.decoding.sampling import filter_logits
from ptmjax.families.model_api import model_api

LENGTH = 6
GREEDY = DecodeConfig(max_decode_length=LENGTH)


@pytest.fixture(scope="module", params=["t5_1_1", pytest.param("gpt2", marks=pytest.mark.slow)])
def model(request):
    module = MODELS[request.param]
    params = peaked_params(module, scale=2.0)
    decode = jax.jit(model_api(module).predict, static_argnums=(2, 3))
    greedy = decode(params, prompt_batch(module), GREEDY, IDS)
    return module, params, decode, greedy


@pytest.mark.parametrize(
    "limit", [dict(temperature=1e-4), dict(top_k=1), dict(top_p=1e-6)], ids=["temperature", "top_k", "top_p"]
)
@pytest.mark.slow
def test_sampling_limits_equal_greedy(model, limit):
    module, params, decode, greedy = model
    config = DecodeConfig(method="sample", max_decode_length=LENGTH, num_decodes=2, **limit)
    out = decode(params, prompt_batch(module), config, IDS, jax.random.key(3))
    for j in range(2):
        np.testing.assert_array_equal(out.tokens[:, j], greedy.tokens[:, 0])
        np.testing.assert_allclose(out.scores[:, j], greedy.scores[:, 0], rtol=1e-5, atol=1e-5)


def test_beam_of_one_is_greedy(model):
    module, params, decode, greedy = model
    config = DecodeConfig(method="beam", max_decode_length=LENGTH, num_beams=1, length_penalty_alpha=0.0)
    out = decode(params, prompt_batch(module), config, IDS)
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.scores, greedy.scores, rtol=1e-5, atol=1e-5)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy(model):
    module, params, decode, greedy = model
    config = DecodeConfig(method="beam", max_decode_length=LENGTH, num_beams=4, num_decodes=4, length_penalty_alpha=0.0)
    out = decode(params, prompt_batch(module), config, IDS)
    assert out.tokens.shape == (3, 4, LENGTH)
    assert (np.asarray(out.scores[:, 0]) >= np.asarray(greedy.scores[:, 0]) - 1e-5).all()
    assert (np.diff(np.asarray(out.scores), axis=1) <= 1e-6).all(), "beams are returned best first"
    assert np.asarray(out.scores[:, 0] > greedy.scores[:, 0] + 1e-3).any(), "beam search never beat greedy here"
    # Each returned score is the model's log-likelihood of its sequence: rescore the beams greedily-forced.
    for j in range(4):
        np.testing.assert_allclose(out.scores[:, j], forced_scores(module, params, out.tokens[:, j]), rtol=1e-4)


def forced_scores(module, params, tokens):
    """Log-likelihood of `tokens` [b, length] (up to EOS) under the model, by teacher forcing."""
    api, batch = model_api(module), prompt_batch(module)
    tokens = np.asarray(tokens)
    weights = np.cumsum(tokens == IDS.eos_token_id, axis=1) - (tokens == IDS.eos_token_id) == 0
    if "encoder_input_tokens" in batch:
        inputs = np.concatenate([np.zeros((len(tokens), 1), np.int32), tokens[:, :-1]], axis=1)
        rows = dict(batch, decoder_input_tokens=inputs, decoder_target_tokens=tokens, decoder_loss_weights=weights)
        return api.score(params, rows)
    scores = []
    for r, prompt in enumerate(np.asarray(batch["decoder_input_tokens"])):
        prompt = prompt[: int(batch["decoder_segment_ids"][r].sum())]
        sequence = np.concatenate([prompt, tokens[r]])[None]
        targets = np.concatenate([prompt[1:], tokens[r], [0]])[None]
        row_weights = np.concatenate([np.zeros(len(prompt) - 1), weights[r], [0]])[None]
        rows = dict(decoder_input_tokens=sequence, decoder_target_tokens=targets, decoder_loss_weights=row_weights)
        scores.append(float(api.score(params, rows)[0]))
    return np.array(scores)


def test_length_penalty_divides_beam_scores(model):
    module, params, decode, _ = model
    plain = DecodeConfig(method="beam", max_decode_length=LENGTH, num_beams=3, length_penalty_alpha=0.0)
    penalised = dataclasses.replace(plain, length_penalty_alpha=0.6)
    out, out_penalised = (decode(params, prompt_batch(module), c, IDS) for c in (plain, penalised))
    lengths = np.where((np.asarray(out_penalised.tokens[:, 0]) == IDS.eos_token_id).any(axis=1),
                       np.argmax(np.asarray(out_penalised.tokens[:, 0]) == IDS.eos_token_id, axis=1) + 1, LENGTH)
    likelihood = forced_scores(module, params, out_penalised.tokens[:, 0])
    np.testing.assert_allclose(out_penalised.scores[:, 0], likelihood / ((5 + lengths) / 6) ** 0.6, rtol=1e-4)
    assert out.scores.shape == out_penalised.scores.shape


def test_forced_first_and_last_tokens(model):
    module, params, decode, greedy = model
    ids = dataclasses.replace(IDS, eos_token_id=47, forced_bos_token_id=9, forced_eos_token_id=47)
    for config in (GREEDY, DecodeConfig(method="beam", max_decode_length=LENGTH, num_beams=3)):
        out = np.asarray(decode(params, prompt_batch(module), config, ids).tokens[:, 0])
        assert (out[:, 0] == 9).all()
        assert ((out == 47).any(axis=1)).all(), "every row ends in the forced EOS by the last step"


def test_sample_distribution_follows_the_model():
    """The first sampled token of 4000 draws follows softmax(logits / T), and top-k / top-p restrict it."""
    module = MODELS["t5_1_1"]
    params = peaked_params(module, scale=0.7)
    batch = {"encoder_input_tokens": jnp.asarray(prompt_batch(module)["encoder_input_tokens"][:1])}
    logits = module.apply({"params": params}, batch["encoder_input_tokens"], jnp.zeros((1, 1), jnp.int32))[0, -1]
    decode = jax.jit(model_api(module).predict, static_argnums=(2, 3))
    draws = 4000
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6)]:
        config = DecodeConfig(method="sample", max_decode_length=1, num_decodes=draws, temperature=temperature,
                              top_k=top_k, top_p=top_p)
        first = np.asarray(decode(params, batch, config, IDS, jax.random.key(0)).tokens[0, :, 0])
        expected = np.asarray(jax.nn.softmax(filter_logits(logits[None] / temperature, top_k, top_p)[0]), np.float64)
        observed = np.bincount(first, minlength=len(expected)) / draws
        assert (observed[expected == 0] == 0).all(), "a filtered-out token was drawn"
        kept = expected > 0
        if top_k:
            assert kept.sum() == top_k
        # Each frequency within 4.5 standard errors of its probability.
        tolerance = 4.5 * np.sqrt(expected * (1 - expected) / draws) + 1e-3
        assert (np.abs(observed - expected) <= tolerance).all(), (observed[kept], expected[kept])


def test_filter_logits_by_hand():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    np.testing.assert_array_equal(np.isfinite(filter_logits(logits, top_k=2)), [[True, True, False, False]])
    np.testing.assert_array_equal(np.isfinite(filter_logits(logits, top_p=0.8)), [[True, True, False, False]])
    np.testing.assert_array_equal(np.isfinite(filter_logits(logits, top_p=0.81)), [[True, True, True, False]])
    np.testing.assert_array_equal(np.isfinite(filter_logits(logits, top_p=0.01)), [[True, False, False, False]])


def test_samples_differ_and_are_reproducible(model):
    module, params, decode, _ = model
    config = DecodeConfig(method="sample", max_decode_length=LENGTH, num_decodes=4, temperature=1.5)
    out = decode(params, prompt_batch(module), config, IDS, jax.random.key(1))
    again = decode(params, prompt_batch(module), config, IDS, jax.random.key(1))
    np.testing.assert_array_equal(out.tokens, again.tokens)
    assert len({tuple(row) for row in np.asarray(out.tokens[0])}) > 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="topk"), "method='topk' is unknown"),
        (dict(max_decode_length=0), "max_decode_length must be a positive int"),
        (dict(method="beam", num_beams=2, num_decodes=3), "num_decodes=3 exceeds num_beams=2"),
        (dict(num_decodes=2), "with method='greedy' would repeat"),
        (dict(method="sample", temperature=0.0), "temperature must be > 0"),
        (dict(method="sample", top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(method="sample", top_k=-1), "top_k must be an int >= 0"),
    ],
)
def test_bad_decode_configs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**kwargs)


def test_missing_ids_and_rng_and_non_generative_models_are_named():
    module = MODELS["t5_1_1"]
    api, params = model_api(module), peaked_params(module)
    batch = prompt_batch(module)
    with pytest.raises(ValueError, match="eos_token_id is None"):
        api.predict(params, batch, GREEDY, GenerationIds())
    with pytest.raises(ValueError, match="decoder_start_token_id is None"):
        api.predict(params, batch, GREEDY, GenerationIds(eos_token_id=1))
    with pytest.raises(ValueError, match="needs an rng"):
        api.predict(params, batch, DecodeConfig(method="sample"), IDS)
    from ptmjax.models import Bert
    from ptmjax.models.encoder import EncoderConfig

    bert = Bert(EncoderConfig(vocab_size=16, d_model=8, num_heads=2, num_layers=1, d_ff=16, max_length=8,
                              dropout_rate=0.0))
    with pytest.raises(ValueError, match="Bert does not generate text"):
        model_api(bert).predict({}, {}, GREEDY, IDS)
