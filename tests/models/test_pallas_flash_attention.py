"""attention_kernel='pallas_tpu_flash' (JAX's Pallas TPU flash-attention kernel, here in TPU interpret mode on
the CPU) equals the einsum reference: one attention layer's output and gradients (parameters, inputs, bias)
under packed causal, prefix-LM and padding masks plus a T5-like bias, lengths that are not multiples of the
kernel's 128-long blocks (several blocks, cross-attention), a sharded layer under a mesh, and whole tiny T5 and
GPT-2 models' logits. Interpret mode is slow, so every shape is tiny."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.layers import pallas_attention
from ptmjax.layers.attention import (
    MultiHeadAttention,
    decoder_self_mask,
    encoder_self_mask,
    mask_to_bias,
    prefix_lm_self_mask,
)
from ptmjax.models import GPT2, EncoderDecoder, GPT2Config, T5Config

HEADS, HEAD_DIM, EMBED = 2, 8, 16
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 0, 0]])
POSITIONS = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 0]])


def random(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> jnp.ndarray:
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def layer_outputs_and_grads(kernel: str, inputs_q, inputs_kv, bias, **layer):
    """A MultiHeadAttention's output and the gradients of a weighted sum of it by params, inputs and bias."""
    module = MultiHeadAttention(HEADS, HEAD_DIM, attention_kernel=kernel, **layer)
    params = module.init(jax.random.key(0), inputs_q, inputs_kv, bias)

    def forward(params, inputs_q, inputs_kv, bias):
        out = module.apply(params, inputs_q, inputs_kv, bias)
        return jnp.sum(out * random(9, out.shape)), out

    (_, out), grads = jax.jit(jax.value_and_grad(forward, argnums=(0, 1, 2, 3), has_aux=True))(
        params, inputs_q, inputs_kv, bias
    )
    return out, grads


def assert_close_to_einsum(inputs_q, inputs_kv, bias, **layer):
    want, want_grads = layer_outputs_and_grads("einsum", inputs_q, inputs_kv, bias, **layer)
    got, got_grads = layer_outputs_and_grads("pallas_tpu_flash", inputs_q, inputs_kv, bias, **layer)
    np.testing.assert_allclose(got, want, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    # One scale for all gradients: some are zero up to rounding (a key projection bias under a softmax).
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * scale), got_grads, want_grads)


def test_layer_equals_einsum_under_packed_causal_prefix_and_padding_masks_with_a_position_bias():
    tokens = jnp.asarray(SEGMENTS > 0, jnp.int32) * 5
    segments = jnp.asarray(SEGMENTS)
    masks = [
        decoder_self_mask(tokens[:1], segments[:1]),  # packed causal, a padding position at the end
        prefix_lm_self_mask(6, jnp.asarray(POSITIONS[1:2] < 2), segments[1:2]),  # packed prefix LM
        encoder_self_mask(tokens[2:]),  # bidirectional over 4 tokens, 2 padding (their rows fully masked)
    ]
    bias = random(1, (1, HEADS, 6, 6)) + mask_to_bias(jnp.concatenate(masks))  # a T5 bias [1, h, q, k] + masks
    x = random(2, (3, 6, EMBED))
    assert_close_to_einsum(x, x, bias)


def test_lengths_that_are_not_multiples_of_the_block_take_several_padded_blocks():
    # 130 queries and 200 keys pad to 256: two query and two key blocks of 128 (cross-attention).
    key_valid = jnp.arange(200)[None] < jnp.asarray([[170]])
    bias = random(3, (1, HEADS, 130, 200)) + mask_to_bias(key_valid[:, None, None, :])
    assert_close_to_einsum(random(4, (1, 130, EMBED)), random(5, (1, 200, EMBED)), bias, use_bias=True,
                           scale_logits=True)  # GPT-2/BERT's biased projections and scaled logits


def test_sharded_layer_runs_the_kernel_per_device_and_equals_einsum():
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, fsdp=2, tensor=2))
    x = random(6, (4, 6, EMBED))
    bias = random(7, (1, HEADS, 6, 6)) + mask_to_bias(encoder_self_mask(jnp.asarray([[3] * 6, [3] * 4 + [0] * 2] * 2)))
    outputs = {}
    for kernel in ("einsum", "pallas_tpu_flash"):
        module = MultiHeadAttention(HEADS, HEAD_DIM, attention_kernel=kernel)
        params = module.init(jax.random.key(0), x, x, bias)
        with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
            outputs[kernel] = jax.jit(module.apply)(params, x, x, bias)
    np.testing.assert_allclose(outputs["pallas_tpu_flash"], outputs["einsum"], atol=1e-5)


T5 = T5Config(
    vocab_size=40, d_model=EMBED, num_heads=HEADS, head_dim=HEAD_DIM, d_ff=32, num_encoder_layers=1,
    num_decoder_layers=1, ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)  # fmt: skip
GPT = GPT2Config(vocab_size=40, d_model=EMBED, num_heads=HEADS, num_layers=1, d_ff=32, max_length=16,
                 dropout_rate=0.0, attention_dropout_rate=0.0)  # fmt: skip


def tokens(seed: int) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(2, 40, SEGMENTS.shape) * (SEGMENTS > 0), jnp.int32)


@pytest.mark.parametrize("case", ["t5_packed", "gpt2_prefix_lm_packed"])
def test_model_logits_equal_einsum(case):
    ids = {"segment_ids": jnp.asarray(SEGMENTS, jnp.int32), "positions": jnp.asarray(POSITIONS, jnp.int32)}
    model, batch = {
        "t5_packed": (EncoderDecoder, dict(
            encoder_input_tokens=tokens(0), decoder_input_tokens=tokens(1), encoder_segment_ids=ids["segment_ids"],
            decoder_segment_ids=ids["segment_ids"], encoder_positions=ids["positions"],
            decoder_positions=ids["positions"],
        )),
        "gpt2_prefix_lm_packed": (GPT2, dict(
            decoder_input_tokens=tokens(2), decoder_segment_ids=ids["segment_ids"], decoder_positions=ids["positions"],
            decoder_causal_attention=jnp.asarray((POSITIONS < 2) * (SEGMENTS > 0), jnp.int32),
        )),
    }[case]  # fmt: skip
    config = T5 if model is EncoderDecoder else GPT
    logits = {}
    for kernel in ("einsum", "pallas_tpu_flash"):
        module = model(dataclasses.replace(config, attention_kernel=kernel))
        params = module.init(jax.random.key(0), **batch)
        logits[kernel] = jax.jit(module.apply)(params, **batch)
    want = logits["einsum"]
    np.testing.assert_allclose(logits["pallas_tpu_flash"], want, atol=1e-5 * float(jnp.max(jnp.abs(want))))


def test_without_a_bias_and_refusing_attention_dropout_and_gpus(monkeypatch):
    x = random(8, (1, 6, EMBED))
    module = MultiHeadAttention(HEADS, HEAD_DIM, dropout_rate=0.1, attention_kernel="pallas_tpu_flash", name="attn")
    params = module.init(jax.random.key(0), x, x)
    want = MultiHeadAttention(HEADS, HEAD_DIM, dropout_rate=0.1, name="attn").apply(params, x, x)
    np.testing.assert_allclose(jax.jit(module.apply)(params, x, x), want, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    with pytest.raises(ValueError, match="kernel='pallas_tpu_flash' has no dropout on attention probabilities"):
        module.apply(params, x, x, enable_dropout=True, rngs={"dropout": jax.random.key(1)})
    monkeypatch.setattr(pallas_attention.jax, "default_backend", lambda: "gpu")
    with pytest.raises(ValueError, match="runs on TPU .* not on 'gpu'; use attention_kernel='cudnn' or 'xla' there"):
        module.apply(params, x, x)
