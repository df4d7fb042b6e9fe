"""The model API: scores against float64 numpy, abstract parameters against a real init, families, unscanned views."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from ptmjax.families.model_api import model_api
from ptmjax.families.registry import DECODER_ONLY, MASKED_LM_WITH_SENTENCE_PAIRS, T5_SEQUENCE_TO_SEQUENCE
from ptmjax.families.token_loss import LossConfig
from ptmjax.models import GPT2, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config

T5 = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
BERT = BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16)
GPT = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16)


def log_softmax64(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def seq2seq_batch(rng: np.random.Generator) -> dict[str, jax.Array]:
    targets = rng.integers(1, 64, (3, 5))
    targets[1, 3:] = 0  # padding, weight 0
    return {
        "encoder_input_tokens": jnp.asarray(rng.integers(1, 64, (3, 7)), jnp.int32),
        "decoder_input_tokens": jnp.asarray(np.pad(targets[:, :-1], ((0, 0), (1, 0))), jnp.int32),
        "decoder_target_tokens": jnp.asarray(targets, jnp.int32),
        "decoder_loss_weights": jnp.asarray(targets != 0, jnp.int32),
    }


def test_families_are_found_by_class_and_config():
    assert model_api(EncoderDecoder(T5)).family is T5_SEQUENCE_TO_SEQUENCE
    assert model_api(GPT2(GPT)).family is DECODER_ONLY
    assert model_api(Bert(BERT)).family is MASKED_LM_WITH_SENTENCE_PAIRS
    with pytest.raises(ValueError, match=r"does not know model class Dense; known: .*EncoderDecoderInterface"):
        model_api(nn.Dense(3))


def test_abstract_parameters_and_axes_are_those_of_a_real_init():
    api = model_api(EncoderDecoder(T5))
    real = api.init(jax.random.key(0))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(real)) == jax.tree.map(
        lambda x: (x.shape, x.dtype), api.abstract_params
    )
    assert nn.get_partition_spec(real) == api.logical_axes


def test_seq2seq_score_is_the_float64_log_likelihood_of_the_targets_and_minus_the_token_loss():
    api = model_api(EncoderDecoder(T5))
    params = nn.unbox(api.init(jax.random.key(1)))
    batch = seq2seq_batch(np.random.default_rng(0))
    logits = EncoderDecoder(T5).apply({"params": params}, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    log_probs = log_softmax64(logits)
    targets, weights = np.asarray(batch["decoder_target_tokens"]), np.asarray(batch["decoder_loss_weights"])
    want = (np.take_along_axis(log_probs, targets[..., None], -1)[..., 0] * weights).sum(-1)
    got = api.score(params, batch)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    token_loss, _, _ = api.loss(params, batch, LossConfig(z_loss=0.0))
    np.testing.assert_allclose(-np.sum(got), token_loss, rtol=1e-5)


def test_mlm_score_is_the_pseudo_log_likelihood_of_the_masked_positions():
    api = model_api(Bert(BERT))
    params = nn.unbox(api.init(jax.random.key(2)))
    rng = np.random.default_rng(1)
    targets = rng.integers(5, 64, (2, 8))
    mask = np.zeros((2, 8), np.int32)
    mask[0, [1, 4]] = mask[1, [2]] = 1
    inputs = np.where(mask == 1, 4, targets)  # 4 plays [MASK]
    batch = {
        "input_tokens": jnp.asarray(inputs, jnp.int32), "target_tokens": jnp.asarray(targets, jnp.int32),
        "loss_mask": jnp.asarray(mask), "sentence_label": jnp.zeros((2,), jnp.int32),
    }
    log_probs = log_softmax64(Bert(BERT).apply({"params": params}, batch["input_tokens"]).mlm_logits)
    want = [log_probs[0, 1, targets[0, 1]] + log_probs[0, 4, targets[0, 4]], log_probs[1, 2, targets[1, 2]]]
    np.testing.assert_allclose(api.score(params, batch), want, rtol=1e-5)


def test_unscanned_view_of_a_scanned_model_is_the_plain_model():
    scanned = model_api(GPT2(dataclasses.replace(GPT, scan_layers=True)))
    plain = model_api(GPT2(GPT))
    assert scanned.scanning and not plain.scanning
    assert plain.unscanned() is plain
    assert scanned.unscanned().abstract_params == plain.abstract_params
    assert "layers" in scanned.abstract_params and "layers_0" in plain.abstract_params
