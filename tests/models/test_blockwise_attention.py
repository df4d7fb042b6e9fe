"""attention_kernel='blockwise' (ptmjax/layers/blockwise_attention.py) equals the einsum reference: one layer's
outputs at real positions and the gradients (parameters, inputs, bias) of a loss over them, with the loop forced
at these tiny sizes both ways it runs (several examples a step; one example in query blocks of 2, causal blocks
skipping the keys after them), for every mask form (segment ids with padding, causal, T5's bias shared by the
batch, a bias per example and one broadcast over the heads, a folded mask with fully masked rows, cross-attention
with fewer queries than keys); under a sharded mesh; whole T5 and GPT-2 models' logits and gradients (T5 also with
scanned, rematerialised layers) and their cached greedy decoding; bfloat16 activations. Below the size where the
loop pays, the kernel is the einsum path itself."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_ATTENTION, assert_attention_close_to_einsum, random_normal, tiny_attention_models

from ptmjax import partitioning
from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.layers import blockwise_attention
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
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 0, 0], [1, 1, 2, 2, 2, 2]])
POSITIONS = np.array([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 0], [0, 1, 0, 1, 2, 3]])


@dataclasses.dataclass
class Plans:
    """How the loop ran in each traced call, forced at any size: `mode` 'examples' takes at most 2 whole examples a
    step, 'query_blocks' blocks of 2 queries of one example."""

    mode: str
    calls: list = dataclasses.field(default_factory=list)

    def assert_looped(self) -> None:
        """Some call ran as `mode` says (decoding's single queries are whole examples either way)."""
        if self.mode == "examples":
            assert any(plan.group == 2 and len(plan.spans) == 1 for plan in self.calls), self.calls
        else:
            assert any(plan.group == 1 and {b - a for a, b in plan.spans} == {2} for plan in self.calls), self.calls


@pytest.fixture(params=["examples", "query_blocks"])
def plans(request, monkeypatch) -> Plans:
    monkeypatch.setattr(blockwise_attention, "LOOP_BYTES", 0)
    plans, plan_of = Plans(request.param), blockwise_attention._Plan.of

    def spy(batch, heads, num_queries, num_keys, causal):
        rows = 2 if plans.mode == "query_blocks" else 2 * num_queries
        monkeypatch.setattr(blockwise_attention, "BLOCK_BYTES", 4 * heads * num_keys * rows)
        plans.calls.append(plan_of(batch, heads, num_queries, num_keys, causal))
        return plans.calls[-1]

    monkeypatch.setattr(blockwise_attention._Plan, "of", spy)
    return plans


def assert_close_to_einsum(inputs_q, inputs_kv, mask: AttentionMask, **layer):
    assert_attention_close_to_einsum("blockwise", inputs_q, inputs_kv, mask, (HEADS, HEAD_DIM), **layer)


def test_packed_encoder_with_t5s_bias_shared_by_the_batch(plans):
    ids, x = jnp.asarray(SEGMENTS), random_normal(1, (4, 6, EMBED))
    assert_close_to_einsum(x, x, encoder_attention_mask(ids, ids, bias=random_normal(2, (1, HEADS, 6, 6))))
    plans.assert_looped()


def test_packed_causal_attention_without_a_bias(plans):
    ids, x = jnp.asarray(SEGMENTS[:2]), random_normal(3, (2, 6, EMBED))
    assert_close_to_einsum(x, x, decoder_attention_mask(ids, ids), use_bias=True, scale_logits=True)
    plans.assert_looped()
    assert all(plan.causal for plan in plans.calls)


def test_causal_attention_with_a_bias_per_example_and_one_shared_by_the_heads(plans):
    ids, x = jnp.asarray(SEGMENTS[:2]), random_normal(4, (2, 6, EMBED))
    assert_close_to_einsum(x, x, decoder_attention_mask(ids, ids, random_normal(5, (2, HEADS, 6, 6))))
    assert_close_to_einsum(x, x, decoder_attention_mask(ids, ids, random_normal(6, (1, 1, 6, 6))))
    plans.assert_looped()


def test_a_folded_mask_with_fully_masked_rows_broadcast_over_the_heads(plans):
    tokens, ids = jnp.asarray(SEGMENTS[1:3] > 0, jnp.int32) * 5, jnp.asarray(SEGMENTS[1:3])
    bias = jnp.concatenate(
        [
            mask_to_bias(prefix_lm_self_mask(6, jnp.asarray(POSITIONS[1:2] < 2), ids[:1])),  # packed prefix LM
            encoder_attention_mask(tokens[1:]).dense_bias(jnp.float32),  # 4 tokens, 2 padding rows fully masked
        ]
    )  # [2, 1, 6, 6]
    x = random_normal(7, (2, 6, EMBED))
    assert_close_to_einsum(x, x, AttentionMask(bias), use_bias=True, scale_logits=True)  # every position
    plans.assert_looped()


def test_packed_cross_attention_with_fewer_queries_than_keys(plans):
    decoder_ids = jnp.asarray([[1, 1, 2, 2], [1, 1, 1, 0]])
    encoder_ids = jnp.asarray([[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    encoder_tokens = jnp.where(jnp.arange(8) == 4, 0, 5) * (encoder_ids > 0)  # padding inside a row too
    mask = cross_attention_mask(decoder_ids, encoder_tokens, decoder_ids, encoder_ids)
    assert_close_to_einsum(
        random_normal(8, (2, 4, EMBED)), random_normal(9, (2, 8, EMBED)), mask, use_bias=True, scale_logits=True
    )
    plans.assert_looped()


def test_sharded_layer_equals_einsum(plans):
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, fsdp=2, tensor=2))
    x, ids = random_normal(10, (4, 6, EMBED)), jnp.asarray(SEGMENTS)
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        assert_close_to_einsum(x, x, encoder_attention_mask(ids, ids, bias=random_normal(11, (1, HEADS, 6, 6))))
    plans.assert_looped()


def test_bfloat16_activations_compute_in_float32_and_come_back_in_bfloat16(plans):
    ids, x = jnp.asarray(SEGMENTS), random_normal(18, (4, 6, EMBED))
    mask = encoder_attention_mask(ids, ids, bias=random_normal(19, (1, HEADS, 6, 6)))
    outputs = {}
    for kernel, dtype in (("einsum", jnp.float32), ("einsum", jnp.bfloat16), ("blockwise", jnp.bfloat16)):
        module = MultiHeadAttention(HEADS, HEAD_DIM, attention_kernel=kernel, dtype=dtype)
        outputs[kernel, dtype] = module.apply(module.init(jax.random.key(0), x, x, mask), x, x, mask)
    want = np.asarray(outputs["einsum", jnp.float32])
    assert outputs["blockwise", jnp.bfloat16].dtype == jnp.bfloat16
    error = {kernel: np.abs(np.asarray(outputs[kernel, jnp.bfloat16], np.float32) - want).max() for kernel in
             ("einsum", "blockwise")}
    assert error["blockwise"] <= 1.5 * error["einsum"], error  # bfloat16 inputs and outputs, float32 inside
    plans.assert_looped()


def test_below_the_size_where_the_loop_pays_it_is_the_einsum_path():
    x, ids = random_normal(12, (4, 6, EMBED)), jnp.asarray(SEGMENTS)
    mask = encoder_attention_mask(ids, ids, bias=random_normal(13, (1, HEADS, 6, 6)))
    outputs = {}
    for kernel in ("einsum", "blockwise"):
        module = MultiHeadAttention(HEADS, HEAD_DIM, attention_kernel=kernel)
        params = module.init(jax.random.key(0), x, x, mask)
        outputs[kernel], sown = module.apply(params, x, x, mask, mutable=["intermediates"])
        assert sown["intermediates"]["attention_weights"][0].shape == (4, HEADS, 6, 6)
    np.testing.assert_array_equal(outputs["blockwise"], outputs["einsum"])
    assert not blockwise_attention.loop_pays(8, 8, 114, 512)  # T5-small's cross-attention: 15 MiB of logits
    assert blockwise_attention.loop_pays(8, 8, 512, 512)  # its encoder: 64 MiB


def test_refuses_attention_dropout_bad_biases_and_causal_cross_attention():
    x = random_normal(14, (2, 6, EMBED))
    module = MultiHeadAttention(HEADS, HEAD_DIM, dropout_rate=0.1, attention_kernel="blockwise", name="attn")
    params = module.init(jax.random.key(0), x, x)
    with pytest.raises(ValueError, match="attention_kernel='blockwise' has no dropout on attention probabilities"):
        module.apply(params, x, x, enable_dropout=True, rngs={"dropout": jax.random.key(1)})
    query, key = random_normal(15, (2, HEADS, 4, HEAD_DIM)), random_normal(16, (2, HEADS, 6, HEAD_DIM))
    with pytest.raises(ValueError, match=r"the attention bias \(3, 2, 4, 6\) does not broadcast to \(2, 2, 4, 6\)"):
        blockwise_attention.blockwise_attention(query, key, key, AttentionMask(random_normal(17, (3, HEADS, 4, 6))))
    with pytest.raises(ValueError, match="a causal mask needs as many queries as keys, got 4 and 6"):
        blockwise_attention.blockwise_attention(query, key, key, AttentionMask(causal=True))


T5, GPT = tiny_attention_models(2)


def tokens(seed: int, valid: np.ndarray) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(2, 40, valid.shape) * (valid > 0), jnp.int32)


MODEL_CASES = {
    "t5_packed": (EncoderDecoder, T5, {
        "encoder_input_tokens": tokens(0, SEGMENTS), "decoder_input_tokens": tokens(1, SEGMENTS),
        "encoder_segment_ids": SEGMENTS, "decoder_segment_ids": SEGMENTS, "encoder_positions": POSITIONS,
        "decoder_positions": POSITIONS,
    }),
    "gpt2_packed": (GPT2, GPT, {
        "decoder_input_tokens": tokens(2, SEGMENTS), "decoder_segment_ids": SEGMENTS,
        "decoder_positions": POSITIONS,
    }),
    "t5_scanned_and_rematerialised": (EncoderDecoder, dataclasses.replace(T5, scan_layers=True, remat_policy="full"), {
        "encoder_input_tokens": tokens(3, SEGMENTS), "decoder_input_tokens": tokens(4, np.ones_like(SEGMENTS)),
    }),
}


@pytest.mark.parametrize("case", sorted(MODEL_CASES))
@pytest.mark.slow
def test_model_logits_and_gradients_equal_einsum(plans, case):
    model_class, config, batch = MODEL_CASES[case]
    batch = {name: jnp.asarray(value, jnp.int32) for name, value in batch.items()}
    real = jnp.asarray(SEGMENTS > 0)[..., None]
    results = {}
    for kernel in ("einsum", "blockwise"):
        model = model_class(dataclasses.replace(config, attention_kernel=kernel))
        params = model.init(jax.random.key(0), **batch)

        def loss(params, model=model):
            logits = model.apply(params, **batch) * real
            return jnp.sum(logits * random_normal(3, logits.shape)), logits

        results[kernel] = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    (_, want), want_grads = results["einsum"]
    (_, got), got_grads = results["blockwise"]
    np.testing.assert_allclose(got, want, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * scale), got_grads, want_grads)
    plans.assert_looped()


@pytest.mark.parametrize("case", ["t5", "gpt2"])
def test_cached_greedy_decoding_equals_einsum(plans, case):
    model_class, config, batch, ids = {
        "t5": (EncoderDecoder, T5, {"encoder_input_tokens": tokens(6, SEGMENTS)},
               GenerationIds(1, 0, decoder_start_token_id=0)),
        "gpt2": (GPT2, GPT, {"decoder_input_tokens": tokens(7, np.ones((4, 4)))}, GenerationIds(1, 0, bos_token_id=0)),
    }[case]
    decoded = {}
    for kernel in ("einsum", "blockwise"):
        api = model_api(model_class(dataclasses.replace(config, attention_kernel=kernel)))
        params = nn.unbox(api.init(jax.random.key(0)))
        decoded[kernel] = api.predict(params, batch, DecodeConfig(max_decode_length=5), ids)
    np.testing.assert_array_equal(decoded["blockwise"].tokens, decoded["einsum"].tokens)
    np.testing.assert_allclose(decoded["blockwise"].scores, decoded["einsum"].scores, rtol=1e-5)
    plans.assert_looped()
