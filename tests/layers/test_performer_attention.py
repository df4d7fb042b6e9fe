"""attention_kernel='performer' (FAVOR+): its error against float64 softmax attention falls as 1/sqrt(features);
the chunked causal scan equals the same features' quadratic form (float64) with packing and a length that is not
a multiple of the chunk; in a GPT-2, a packed row's second sequence gets the outputs it gets alone; masks with no
linear form are refused in one line."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax import partitioning
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.layers.performer_attention import CHUNK, favor_attention, random_projection
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config

B, H, N, D = 2, 2, 150, 16  # N spans three chunks, the last one partly
PACKED = np.ones((B, N), np.int32)
PACKED[0, 60:] = 2  # two sequences in row 0
PACKED[1, 140:] = 0  # padding at the end of row 1
PADDED = np.where(PACKED > 0, 1, 0)


def inputs(scale: float) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(B, H, N, D)) * s for s in (scale, scale, 1.0)]


def allowed(ids: np.ndarray, causal: bool) -> np.ndarray:
    """bool [b, 1, q, k]: the same nonzero segment, and k <= q if causal."""
    mask = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0)
    return (mask & np.tril(np.ones((N, N), bool)) if causal else mask)[:, None]


def favor(q, k, v, ids, causal, projection) -> np.ndarray:
    mask = AttentionMask(None, jnp.asarray(ids), jnp.asarray(ids), causal=causal, unpacked=not causal)
    return np.asarray(favor_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), mask, projection))


def relative_error(out: np.ndarray, reference: np.ndarray, ids: np.ndarray) -> float:
    real = np.broadcast_to((ids > 0)[:, None, :, None], out.shape)
    return float(np.sqrt(np.mean((out - reference)[real] ** 2) / np.mean(reference[real] ** 2)))


@pytest.mark.parametrize("causal, ids", [(False, PADDED), (True, PACKED)], ids=["bidirectional", "causal_packed"])
def test_the_error_against_float64_softmax_attention_falls_as_one_over_root_features(causal, ids):
    q, k, v = inputs(0.2)
    logits = np.where(allowed(ids, causal), np.einsum("bhqd,bhkd->bhqk", q, k), -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True, initial=-1e30))
    reference = np.einsum("bhqk,bhkd->bhqd", weights / np.maximum(weights.sum(-1, keepdims=True), 1e-300), v)
    errors = {m: np.mean([relative_error(favor(q, k, v, ids, causal, random_projection(seed, m, D)), reference, ids)
                          for seed in range(3)]) for m in (16, 256, 4096)}
    # measured: bidirectional 0.35 / 0.10 / 0.043, causal 0.28 / 0.072 / 0.031; 1/sqrt(m) gives a factor 4 a step
    assert errors[256] < errors[16] / 2.5 and errors[4096] < errors[256] / 2 and errors[4096] < 0.05, errors


def test_the_chunked_causal_scan_equals_the_quadratic_form_of_the_same_features():
    q, k, v = inputs(0.5)
    projection = random_projection(1, 32, D)
    w = np.asarray(projection, np.float64)
    features = [np.exp(np.einsum("bhnd,md->bhnm", x, w) - 0.5 * np.sum(x * x, -1, keepdims=True)) for x in (q, k)]
    scores = np.einsum("bhqm,bhkm->bhqk", *features) * allowed(PACKED, causal=True)
    reference = np.einsum("bhqk,bhkd->bhqd", scores, v) / np.maximum(scores.sum(-1, keepdims=True), 1e-300)
    assert N % CHUNK and relative_error(favor(q, k, v, PACKED, True, projection), reference, PACKED) < 1e-5


GPT = GPT2Config(vocab_size=40, d_model=32, num_heads=2, num_layers=2, d_ff=32, max_length=16, dropout_rate=0.0,
                 attention_dropout_rate=0.0, attention_kernel="performer", performer_features=64)


def test_a_packed_rows_second_sequence_gets_the_outputs_it_gets_alone():
    model = GPT2(dataclasses.replace(GPT, num_layers=1))
    first, second = np.arange(2, 9), np.arange(11, 20)
    rows = {"packed": (np.concatenate([first, second]), [1] * 7 + [2] * 9, [*range(7), *range(9)]),
            "alone": (np.pad(second, (0, 7)), [1] * 9 + [0] * 7, [*range(9), *[0] * 7])}
    tokens, segments, positions = (jnp.asarray([rows[name][i] for name in rows], jnp.int32) for i in range(3))
    params = nn.unbox(model.init(jax.random.key(0), tokens))["params"]
    logits = jax.jit(model.apply)({"params": params}, tokens, decoder_segment_ids=segments,
                                  decoder_positions=positions)
    np.testing.assert_allclose(logits[0, 7:], logits[1, :9], atol=2e-5 * float(jnp.abs(logits).max()))
    exact = GPT2(dataclasses.replace(model.config, attention_kernel="einsum")).apply({"params": params}, tokens[1:, :9])
    assert float(jnp.abs(logits[1, :9] - exact[0]).max()) > 1e-4  # an approximation, not the exact attention


@pytest.mark.slow
def test_a_sharded_gpt2_equals_one_device_in_loss_and_gradients():
    model = GPT2(dataclasses.replace(GPT, d_model=64, num_layers=1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 40, (8, 16)), jnp.int32)
    params = nn.unbox(model.init(jax.random.key(0), tokens))["params"]

    def loss(params):
        logits = model.apply({"params": params}, tokens[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1))

    grad = jax.jit(jax.value_and_grad(loss))
    want_loss, want_grads = grad(params)
    with jax.set_mesh(partitioning.make_mesh(partitioning.MeshConfig(data=2, fsdp=2, tensor=2))), \
            nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        got_loss, got_grads = grad(params)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * float(jnp.abs(w).max()) + 1e-9),
                 got_grads, want_grads)


def test_masks_with_no_linear_form_are_refused_in_one_line():
    t5 = EncoderDecoder(T5Config(vocab_size=40, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
                                 num_decoder_layers=1, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
                                 attention_kernel="performer"))
    ids = jnp.ones((1, 4), jnp.int32)
    params = jax.eval_shape(t5.init, jax.random.key(0), ids, ids)
    with pytest.raises(ValueError, match=r"^attention_kernel='performer' takes causality and segment ids only.*T5"):
        jax.eval_shape(t5.apply, params, ids, ids)
    q = jnp.ones((1, 1, 4, 8))
    bidirectional_packed = AttentionMask(None, jnp.asarray([[1, 1, 2, 2]]), jnp.asarray([[1, 1, 2, 2]]))
    with pytest.raises(ValueError, match=r"packs sequences only with causal attention; set train.pack=False"):
        favor_attention(q, q, q, bidirectional_packed, random_projection(0, 8, 8))
    with pytest.raises(ValueError, match=r"performer_features must be a positive int, got 0"):
        dataclasses.replace(GPT, performer_features=0)
