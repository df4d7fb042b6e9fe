"""attention_kernel='pallas_tpu_flash' (JAX's Pallas TPU flash-attention kernel, here in TPU interpret mode on
the CPU) equals the einsum reference at every real position (a nonzero query segment id): one attention layer's
output and the gradients (parameters, inputs, bias) of a loss over real positions, with the masks handed to the
kernel as segment ids and `causal` (packed causal self-attention with no bias at all, over several blocks; a
packed encoder; T5's bias with segments; padding without packing; packed cross-attention of 130 queries and 200
keys) or as the folded bias it falls back to (prefix LM, fully masked rows); a sharded layer under a mesh; whole
tiny T5 and GPT-2 models' logits (GPT-2 also prefix-LM and prefix-tuned), and T5's cached decoding (slow). Each
test also checks what the kernel got (`ab`, segment ids, `causal`). Interpret mode is slow: every shape is tiny."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_ATTENTION, assert_attention_close_to_einsum, random_normal, tiny_attention_models
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.adapt.prefix_tuning import prefix_tuning
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.layers import pallas_attention
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import (
    AttentionMask,
    cross_attention_mask,
    decoder_attention_mask,
    encoder_attention_mask,
    mask_to_bias,
    prefix_lm_self_mask,
)
from ptmjax.models import GPT2, EncoderDecoder

HEADS, HEAD_DIM, EMBED = TINY_ATTENTION
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 0, 0]])
POSITIONS = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 0]])


def segments(*rows: list[tuple[int, int]]) -> jnp.ndarray:
    """Segment ids [len(rows), length] from runs of (segment id, length)."""
    return jnp.asarray([np.concatenate([[i] * n for i, n in row]) for row in rows], jnp.int32)


@pytest.fixture
def kernel_calls(monkeypatch) -> list[dict]:
    """What each traced call of the kernel's forward pass got: whether `ab` and segment ids, and `causal`."""
    calls, forward = [], pallas_attention.tpu_flash._flash_attention

    def spy(query, key, value, ab, segment_ids, save_residuals, causal, *rest):
        calls.append({"ab": ab is not None, "segment_ids": segment_ids is not None, "causal": causal})
        return forward(query, key, value, ab, segment_ids, save_residuals, causal, *rest)

    monkeypatch.setattr(pallas_attention.tpu_flash, "_flash_attention", spy)
    return calls


def assert_close_to_einsum(inputs_q, inputs_kv, mask: AttentionMask, **layer):
    assert_attention_close_to_einsum("pallas_tpu_flash", inputs_q, inputs_kv, mask, (HEADS, HEAD_DIM), **layer)


@pytest.mark.slow
def test_packed_causal_attention_without_a_bias_takes_segment_ids_and_causal_and_no_bias(kernel_calls):
    # GPT-2's mask: 200 positions pad to two blocks of 128 (the kernel skips the one above the diagonal).
    ids, x = segments([(1, 90), (2, 100), (0, 10)], [(1, 150), (2, 50)]), random_normal(1, (2, 200, EMBED))
    assert_close_to_einsum(x, x, decoder_attention_mask(ids, ids), use_bias=True, scale_logits=True)
    assert kernel_calls == [{"ab": False, "segment_ids": True, "causal": True}]


@pytest.mark.parametrize("bias", [None, "t5"])
@pytest.mark.slow
def test_packed_encoder_attention_with_and_without_t5s_bias(kernel_calls, bias):
    ids = jnp.asarray(SEGMENTS)
    bias = None if bias is None else random_normal(2, (1, HEADS, 6, 6))  # the relative-position bias [1, h, q, k]
    x = random_normal(3, (3, 6, EMBED))
    assert_close_to_einsum(x, x, encoder_attention_mask(ids, ids, bias=bias))
    assert kernel_calls == [{"ab": bias is not None, "segment_ids": True, "causal": False}]


def test_t5_decoder_attention_with_its_bias_and_segments(kernel_calls):
    ids, x = jnp.asarray(SEGMENTS), random_normal(4, (3, 6, EMBED))
    assert_close_to_einsum(x, x, decoder_attention_mask(ids, ids, random_normal(5, (3, HEADS, 6, 6))))
    assert kernel_calls == [{"ab": True, "segment_ids": True, "causal": True}]


def test_padding_without_packing_is_segment_zero(kernel_calls):
    tokens = jnp.asarray([[5, 6, 7, 8, 1, 1], [5, 6, 1, 1, 1, 1], [5, 6, 7, 8, 9, 10]])  # padding id 1, as BART's
    mask = encoder_attention_mask(tokens, pad_token_id=1)
    np.testing.assert_array_equal(mask.query_segment_ids, tokens != 1)
    x = random_normal(6, (3, 6, EMBED))
    assert_close_to_einsum(x, x, mask, use_bias=True, scale_logits=True)
    assert kernel_calls == [{"ab": False, "segment_ids": True, "causal": False}]


@pytest.mark.slow
def test_packed_cross_attention_over_several_blocks(kernel_calls):
    # 130 queries and 200 keys pad to 256: two query and two key blocks of 128; encoder padding inside a row too.
    decoder_ids = segments([(1, 60), (2, 65), (0, 5)], [(1, 130)])
    encoder_ids = segments([(1, 100), (2, 100)], [(1, 170), (0, 30)])
    encoder_tokens = jnp.where(jnp.arange(200) % 7 == 3, 0, 5) * (encoder_ids > 0)
    mask = cross_attention_mask(decoder_ids, encoder_tokens, decoder_ids, encoder_ids)
    assert_close_to_einsum(random_normal(7, (2, 130, EMBED)), random_normal(8, (2, 200, EMBED)), mask, use_bias=True,
                           scale_logits=True)
    assert kernel_calls == [{"ab": False, "segment_ids": True, "causal": False}]


def test_masks_without_a_structured_form_fall_back_to_the_folded_bias(kernel_calls):
    tokens, ids = jnp.asarray(SEGMENTS > 0, jnp.int32) * 5, jnp.asarray(SEGMENTS)
    masks = [
        decoder_attention_mask(tokens[:1], ids[:1]).dense_bias(jnp.float32),  # packed causal, a padding row
        mask_to_bias(prefix_lm_self_mask(6, jnp.asarray(POSITIONS[1:2] < 2), ids[1:2])),  # packed prefix LM
        encoder_attention_mask(tokens[2:]).dense_bias(jnp.float32),  # 4 tokens, 2 padding rows fully masked
    ]
    bias = random_normal(1, (1, HEADS, 6, 6)) + jnp.concatenate(masks)  # a T5 bias [1, h, q, k] + the masks
    x = random_normal(2, (3, 6, EMBED))
    assert_close_to_einsum(x, x, AttentionMask(bias))  # every position, padding rows included
    assert kernel_calls == [{"ab": True, "segment_ids": True, "causal": False}]  # ids of the block padding


@pytest.mark.slow
def test_sharded_layer_runs_the_kernel_per_device_and_equals_einsum():
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, fsdp=2, tensor=2))
    x, ids = random_normal(6, (4, 6, EMBED)), jnp.asarray(np.concatenate([SEGMENTS, SEGMENTS[1:2]]))
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        assert_close_to_einsum(x, x, encoder_attention_mask(ids, ids, bias=random_normal(7, (1, HEADS, 6, 6))))


T5, GPT = tiny_attention_models(1)


def tokens(seed: int) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(2, 40, SEGMENTS.shape) * (SEGMENTS > 0), jnp.int32)


@pytest.mark.parametrize("case", ["t5_packed", "gpt2_packed", "gpt2_prefix_lm_packed", "gpt2_prefix_tuned_packed"])
def test_model_logits_equal_einsum(kernel_calls, case):
    ids = {"segment_ids": jnp.asarray(SEGMENTS, jnp.int32), "positions": jnp.asarray(POSITIONS, jnp.int32)}
    gpt2 = {"decoder_input_tokens": tokens(2), "decoder_segment_ids": ids["segment_ids"],
            "decoder_positions": ids["positions"]}
    model, config, batch = {
        "t5_packed": (EncoderDecoder, T5, dict(
            encoder_input_tokens=tokens(0), decoder_input_tokens=tokens(1), encoder_segment_ids=ids["segment_ids"],
            decoder_segment_ids=ids["segment_ids"], encoder_positions=ids["positions"],
            decoder_positions=ids["positions"],
        )),
        "gpt2_packed": (GPT2, GPT, gpt2),
        "gpt2_prefix_lm_packed": (GPT2, GPT, dict(
            gpt2, decoder_causal_attention=jnp.asarray((POSITIONS < 2) * (SEGMENTS > 0), jnp.int32)
        )),
        "gpt2_prefix_tuned_packed": (lambda config: prefix_tuning(GPT2(config), length=3, hidden=None), GPT, gpt2),
    }[case]
    logits = {}
    for kernel in ("einsum", "pallas_tpu_flash"):
        module = model(dataclasses.replace(config, attention_kernel=kernel))
        params = module.init(jax.random.key(0), **batch)
        logits[kernel] = jax.jit(module.apply)(params, **batch)
    real = SEGMENTS > 0
    want = logits["einsum"][real]
    np.testing.assert_allclose(logits["pallas_tpu_flash"][real], want, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    assert {
        "t5_packed": [
            {"ab": True, "segment_ids": True, "causal": False},  # the encoder: relative positions, segments
            {"ab": True, "segment_ids": True, "causal": True},  # the decoder's self-attention
            {"ab": False, "segment_ids": True, "causal": False},  # cross-attention
        ],
        "gpt2_packed": [{"ab": False, "segment_ids": True, "causal": True}],
        # The folded bias (prefix LM; the segments and causality folded for the prefix's keys), segment ids for
        # the block padding.
        "gpt2_prefix_lm_packed": [{"ab": True, "segment_ids": True, "causal": False}],
        "gpt2_prefix_tuned_packed": [{"ab": True, "segment_ids": True, "causal": False}],
    }[case] == kernel_calls


@pytest.mark.slow
def test_cached_greedy_decoding_of_t5_equals_einsum(kernel_calls):
    # Each step: self-attention over the cache slots (the folded bias), cross-attention by segment ids (1 on the
    # encoder's tokens, 0 on its padding).
    batch, how = {"encoder_input_tokens": tokens(6)}, DecodeConfig(max_decode_length=5)
    decoded = {}
    for kernel in ("einsum", "pallas_tpu_flash"):
        api = model_api(EncoderDecoder(dataclasses.replace(T5, attention_kernel=kernel)))
        params = jax.tree.map(lambda b: b.value, api.init(jax.random.key(0)), is_leaf=lambda x: hasattr(x, "value"))
        decoded[kernel] = api.predict(params, batch, how, GenerationIds(1, 0, decoder_start_token_id=0))
    np.testing.assert_array_equal(decoded["pallas_tpu_flash"].tokens, decoded["einsum"].tokens)
    np.testing.assert_allclose(decoded["pallas_tpu_flash"].scores, decoded["einsum"].scores, rtol=1e-5)
    assert {"ab": False, "segment_ids": True, "causal": False} in kernel_calls


def test_without_a_mask_and_refusing_attention_dropout_and_gpus(monkeypatch):
    x = random_normal(8, (1, 6, EMBED))
    module = MultiHeadAttention(HEADS, HEAD_DIM, dropout_rate=0.1, attention_kernel="pallas_tpu_flash", name="attn")
    params = module.init(jax.random.key(0), x, x)
    want = MultiHeadAttention(HEADS, HEAD_DIM, dropout_rate=0.1, name="attn").apply(params, x, x)
    np.testing.assert_allclose(jax.jit(module.apply)(params, x, x), want, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    with pytest.raises(ValueError, match="kernel='pallas_tpu_flash' has no dropout on attention probabilities"):
        module.apply(params, x, x, enable_dropout=True, rngs={"dropout": jax.random.key(1)})
    monkeypatch.setattr(pallas_attention.jax, "default_backend", lambda: "gpu")
    with pytest.raises(ValueError, match="runs on TPU .* not on 'gpu'; use attention_kernel='cudnn' or 'xla' there"):
        module.apply(params, x, x)
