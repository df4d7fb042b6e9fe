"""Rank classification: candidate log-likelihoods of tiny random T5 and GPT-2 against float64 NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from ptmjax.evaluation import rank_classification as evaluation
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config

CONFIG = T5Config(
    vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
EXAMPLES = [[5, 9, 12, 1], [7, 1], [3, 30, 31, 17, 22, 1]]  # encoder tokens with EOS, unpadded
CANDIDATES = [[4, 1], [8, 8, 13, 1], [1], [25, 6, 1]]  # target tokens with EOS, unpadded


def padded(rows: list[list[int]], length: int) -> np.ndarray:
    return np.array([row + [0] * (length - len(row)) for row in rows], np.int32)


def log_softmax64(logits) -> np.ndarray:
    shifted = np.asarray(logits, np.float64)
    shifted = shifted - shifted.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def reference_log_likelihoods(model, params, inputs: list[int], candidates: list[list[int]]) -> list[float]:
    """One unpadded example against each candidate: sum over t of the float64 log-softmax at the target token.

    The candidates share one decoder call, padded at the end (the decoder is causal, so later padding is unseen).
    """
    length = max(map(len, candidates))
    decoder_inputs = padded([[0] + target[:-1] for target in candidates], length)
    encoder_inputs = jnp.array([inputs] * len(candidates))
    log_probs = log_softmax64(model.apply({"params": params}, encoder_inputs, jnp.asarray(decoder_inputs)))
    return [float(sum(log_probs[j, t, token] for t, token in enumerate(target))) for j, target in enumerate(candidates)]


@pytest.fixture(scope="module")
def model_and_params():
    model = EncoderDecoder(CONFIG)
    tokens = jnp.ones((1, 1), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), tokens, tokens)["params"]
    return model, jax.tree.map(lambda x: x * 3.0, params)  # sharper distributions than the init's


def test_candidate_log_likelihoods_match_a_float64_reference(model_and_params):
    model, params = model_and_params
    scores = evaluation.candidate_log_likelihoods(
        model, params, EXAMPLES, padded(CANDIDATES, 5), {"inputs": 8, "targets": 5}, batch_size=2
    )  # 3 examples in batches of 2: the last batch is shorter
    want = np.array([reference_log_likelihoods(model, params, x, CANDIDATES) for x in EXAMPLES])
    assert scores.shape == (3, 4)
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-4)
    assert np.ptp(want) > 1.0  # the candidates really differ, so the ranking is tested
    np.testing.assert_array_equal(scores.argmax(axis=1), want.argmax(axis=1))


@pytest.mark.slow
def test_decoder_only_candidates_follow_their_example_as_a_bidirectional_prefix():
    """GPT-2 reads example + candidate as one row; the prefix (the inputs, and the first shifted-in
    position) attends both ways, and only the candidate's tokens are scored."""
    model = GPT2(GPT2Config(vocab_size=40, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16,
                            dropout_rate=0.0, attention_dropout_rate=0.0))
    params = jax.tree.map(lambda x: x * 3.0, jax.jit(model.init)(jax.random.key(1), jnp.ones((1, 1), jnp.int32)))
    params = params["params"]
    scores = evaluation.candidate_log_likelihoods(
        model, params, EXAMPLES, padded(CANDIDATES, 5), {"inputs": 8, "targets": 5}
    )
    for i, inputs in enumerate(EXAMPLES):
        for j, candidate in enumerate(CANDIDATES):
            row = inputs + candidate
            causal_prefix = [1] * (len(inputs) + 1) + [0] * (len(candidate) - 1)
            logits = model.apply({"params": params}, jnp.array([[0] + row[:-1]]),
                                 decoder_causal_attention=jnp.array([causal_prefix]))
            log_probs = log_softmax64(logits)[0]
            want = sum(log_probs[len(inputs) + t, token] for t, token in enumerate(candidate))
            np.testing.assert_allclose(scores[i, j], want, rtol=1e-5, atol=1e-4)
    assert np.ptp(scores) > 1.0


def test_masked_lm_families_are_refused():
    from ptmjax.models import Bert, BertConfig

    bert = Bert(BertConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_length=16))
    with pytest.raises(ValueError, match="scores encoder-decoder and decoder-only models .* Bert is neither"):
        evaluation.candidate_log_likelihoods(bert, {}, EXAMPLES, padded(CANDIDATES, 5), {"inputs": 8, "targets": 5})


def test_encode_candidates_pads_and_refuses_what_does_not_fit():
    vocabulary = seqio.ByteVocabulary(extra_ids=0)  # byte b -> id b + 3
    np.testing.assert_array_equal(evaluation.encode_candidates(vocabulary, ["ab", "c"], 4),
                                  [[100, 101, 1, 0], [102, 1, 0, 0]])
    with pytest.raises(ValueError, match="'abcd' is 5 tokens"):
        evaluation.encode_candidates(vocabulary, ["abcd"], 4)
