"""Sparse attention patterns (ptmjax/layers/attention_patterns.py): each pattern's mask equals one written here in
NumPy from its paper's rule; an attention layer with the pattern ('blockwise', which skips the tiles it masks
entirely, 'einsum' and 'xla', which take it as a bias) equals the einsum path given that NumPy mask as an explicit
bias, outputs and gradients, bidirectional and causal, packed, with T5's bias; the blockwise path's FLOPs fall
with the window as its live tiles do; the encoders of BERT, T5 (with its relative bias) and BART with a pattern
equal the dense model given the NumPy mask as an explicit bias; GPT-2 with a sliding window trains, and GPT-2 and
T5 sharded equal one device; a pattern under context parallelism, on a config that cannot apply it and in a Hugging
Face export is refused in one line."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import attention_outputs_and_grads, random_normal, tiny_attention_models

from ptmjax import partitioning
from ptmjax.convert import hf_bart, hf_bert, hf_gpt2, hf_t5
from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import AttentionMask, mask_to_bias
from ptmjax.layers.attention_patterns import (
    AnyOf,
    DilatedWindow,
    FixedChunks,
    GlobalTokens,
    RandomBlocks,
    SlidingWindow,
    live_tiles,
)
from ptmjax.layers.blockwise_attention import PATTERN_TILE, blockwise_attention
from ptmjax.models import GPT2, Bart, BartConfig, Bert, BertConfig, EncoderDecoder, LongT5Config, MPNetConfig
from ptmjax.partitioning import CONTEXT_RULES, MeshConfig

LENGTH = 260  # three query and key tiles of PATTERN_TILE (128), the last one short
P = np.arange(LENGTH)  # query and key positions
D = P[:, None] - P[None, :]  # query minus key
BIGBIRD = AnyOf((SlidingWindow(20), GlobalTokens((0, 150)), RandomBlocks(64, 1, 512, seed=3)))


def random_block_mask() -> np.ndarray:
    """BigBird's random part as drawn: query block i of 64 attends the block of its row in the seed's table."""
    mask = np.zeros((LENGTH, LENGTH), bool)
    for row in range(8):
        chosen = np.random.default_rng([3, row]).choice(8, 1, replace=False)[0]
        mask[row * 64:(row + 1) * 64, chosen * 64:(chosen + 1) * 64] = True
    return mask


PATTERNS = {  # each pattern and its mask written from the rule
    "sliding_window": (SlidingWindow(40), np.abs(D) < 40),
    "dilated_window": (DilatedWindow(10, 3), (np.abs(D) < 30) & (D % 3 == 0)),
    "fixed_chunks": (FixedChunks(64, 2), (P[:, None] // 64 == P[None, :] // 64) | (P[None, :] % 64 >= 62)),
    "bigbird": (BIGBIRD, (np.abs(D) < 20) | np.isin(P, (0, 150))[:, None] | np.isin(P, (0, 150))[None, :]
                | random_block_mask()),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_masks_equal_their_rules(name):
    pattern, want = PATTERNS[name]
    np.testing.assert_array_equal(pattern.allowed(P, P), want)  # NumPy
    np.testing.assert_array_equal(np.asarray(pattern.allowed(jnp.asarray(P), jnp.asarray(P))), want)  # JAX


def packed_rows() -> jnp.ndarray:
    ids = np.ones((2, LENGTH), np.int32)
    ids[0, 140:] = 2  # two segments
    ids[1, 250:] = 0  # padding
    return jnp.asarray(ids)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_layer_with_a_pattern_equals_einsum_with_the_explicit_mask(name, causal):
    pattern, allowed = PATTERNS[name]
    ids, x, bias = packed_rows(), random_normal(1, (2, LENGTH, 16)), random_normal(2, (1, 2, LENGTH, LENGTH))
    segments = np.asarray(ids)
    explicit = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0) & allowed
    explicit &= D >= 0 if causal else True
    real = jnp.asarray(segments > 0)
    reference = AttentionMask(bias + mask_to_bias(jnp.asarray(explicit[:, None])))
    want, want_grads = attention_outputs_and_grads("einsum", x, x, reference, real, (2, 8))
    want_grads = (*want_grads[:3], jnp.sum(want_grads[3], 0, keepdims=True))  # the bias's: shared by the batch
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    for kernel in ("blockwise", "einsum") if name != "bigbird" else ("blockwise", "einsum", "xla"):
        mask = AttentionMask(bias, ids, ids, causal=causal, pattern=pattern)
        got, got_grads = attention_outputs_and_grads(kernel, x, x, mask, real, (2, 8))
        np.testing.assert_allclose(got[real], want[real], atol=1e-5 * float(jnp.max(jnp.abs(want[real]))))
        jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * scale), got_grads, want_grads)


def blockwise_flops(pattern, length: int) -> float:
    """XLA's FLOPs of the causal blockwise kernel's forward and backward pass (one example, 2 heads of 32)."""
    shape = jax.ShapeDtypeStruct((1, 2, length, 32), jnp.float32)

    def loss(query, key, value):
        ids = jnp.ones((1, length), jnp.int32)
        return jnp.sum(blockwise_attention(query, key, value, AttentionMask(None, ids, ids, True, pattern=pattern)))

    cost = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["flops"]


def test_blockwise_flops_fall_with_the_window_as_the_live_tiles_do():
    length = 8 * PATTERN_TILE
    dense = blockwise_flops(SlidingWindow(length), length)
    all_tiles = sum(len(t) for t in live_tiles(SlidingWindow(length), length, length, PATTERN_TILE, True))
    assert all_tiles == 36  # the causal triangle of 8 x 8 tiles
    ratios = {}
    for window in (128, 256, 512):
        live = sum(len(t) for t in live_tiles(SlidingWindow(window), length, length, PATTERN_TILE, True))
        ratios[window] = blockwise_flops(SlidingWindow(window), length) / dense
        assert ratios[window] == pytest.approx(live / all_tiles, rel=0.02), (window, ratios[window], live / all_tiles)
    assert ratios[128] < ratios[256] < ratios[512] < 0.85, ratios  # 15, 21 and 30 of 36 tiles


T5_TINY, GPT_TINY = tiny_attention_models(2)
GPT_WINDOW = dataclasses.replace(GPT_TINY, max_length=288, attention_kernel="blockwise",
                                 attention_pattern=SlidingWindow(48))
ENCODERS = {  # family -> (model class, tiny config, whether its `encode` takes segment ids)
    "bert": (Bert, BertConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=LENGTH,
                              dropout_rate=0.0, attention_dropout_rate=0.0), False),
    "t5": (EncoderDecoder, T5_TINY, True),
    "bart": (Bart, BartConfig(vocab_size=40, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=1,
                              d_ff=32, max_length=LENGTH, pad_token_id=0, dropout_rate=0.0), True),
}


def with_explicit_mask(allowed: np.ndarray):
    """A flax interceptor giving every encoder self-attention (the submodules named 'attention') its mask folded
    into one bias plus `allowed` [q, k] as a bias: the einsum path with the pattern written out."""
    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        if isinstance(module, MultiHeadAttention) and context.method_name == "__call__" and module.name == "attention":
            inputs_q, inputs_kv, mask, *rest = args
            bias = mask.dense_bias(jnp.float32) + mask_to_bias(jnp.asarray(allowed))[None, None]
            args = (inputs_q, inputs_kv, AttentionMask(bias), *rest)
        return next_fun(*args, **kwargs)
    return interceptor


@pytest.mark.parametrize("name", ["sliding_window", "bigbird"])
@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_encoder_with_a_pattern_equals_the_dense_model_with_the_explicit_mask(family, name):
    """Rows of 260 tokens, one padded from 250 (T5 and BART: the other packed, two segments); the encoder's
    output at every real token, 'einsum' and 'blockwise' with the pattern against the dense model's einsum path
    with the NumPy mask (relative 1e-5)."""
    module, config, packed = ENCODERS[family]
    pattern, allowed = PATTERNS[name]
    ids = packed_rows() if packed else jnp.asarray(np.arange(LENGTH)[None] < np.array([[LENGTH], [250]]), jnp.int32)
    tokens = jnp.where(ids > 0, jnp.asarray(np.random.default_rng(4).integers(2, 40, (2, LENGTH))), 0)
    inputs = (tokens, ids) if packed else (tokens,)
    method = module.encode
    dense = module(config)
    params = jax.jit(functools.partial(dense.init, method=method))(jax.random.key(0), *inputs)
    with nn.intercept_methods(with_explicit_mask(allowed)):
        want = jax.jit(functools.partial(dense.apply, method=method))(params, *inputs)
    real = np.asarray(ids) > 0
    scale = float(jnp.max(jnp.abs(want[real])))
    plain = jax.jit(functools.partial(dense.apply, method=method))(params, *inputs)
    assert float(jnp.max(jnp.abs(plain - want)[real])) > 1e-3 * scale, "the pattern made no difference"
    for kernel in ("einsum", "blockwise"):
        sparse = module(dataclasses.replace(config, attention_pattern=pattern, attention_kernel=kernel))
        got = jax.jit(functools.partial(sparse.apply, method=method))(params, *inputs)
        print(f"{family} {name} {kernel}: max |diff| / max |output| = "
              f"{float(jnp.max(jnp.abs(got - want)[real])) / scale:.1e}")
        np.testing.assert_allclose(got[real], want[real], atol=1e-5 * scale, err_msg=kernel)


def language_model_batch() -> dict[str, jnp.ndarray]:
    """Rows of 260 tokens where each token repeats the one 8 before it (learnable within the window)."""
    start = np.random.default_rng(0).integers(2, 40, (4, 8))
    return {"decoder_input_tokens": jnp.asarray(np.tile(start, (1, -(-LENGTH // 8)))[:, :LENGTH], jnp.int32)}


def loss_fn(model, params, tokens):
    """GPT-2: next-token loss over the rows; T5: the encoder reads the rows, the decoder predicts their 16
    first tokens."""
    if isinstance(model, EncoderDecoder):
        targets = tokens[:, :16]
        logits = model.apply(params, tokens, jnp.pad(targets[:, :-1], ((0, 0), (1, 0))))
    else:
        logits, targets = model.apply(params, tokens[:, :-1]), tokens[:, 1:]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


def test_gpt2_with_a_sliding_window_trains():
    model, tokens = GPT2(GPT_WINDOW), language_model_batch()["decoder_input_tokens"]
    params = model.init(jax.random.key(0), tokens[:, :-1])
    optimizer = optax.adam(1e-2)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(functools.partial(loss_fn, model))(params, tokens)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state, losses = optimizer.init(params), []
    for _ in range(8):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert all(b < a for a, b in zip(losses[:-1], losses[1:], strict=True)) and losses[-1] < 0.85 * losses[0], losses


SHARDED = {  # the blockwise kernel with a sliding window of 48: GPT-2 causal, T5's encoder with its bias (one layer)
    "gpt2": GPT2(GPT_WINDOW),
    "t5": EncoderDecoder(dataclasses.replace(
        tiny_attention_models(1)[0], attention_kernel="blockwise", attention_pattern=SlidingWindow(48))),
}


def init_params(model, tokens):
    inputs = (tokens, tokens[:, :16]) if isinstance(model, EncoderDecoder) else (tokens[:, :-1],)
    return jax.jit(model.init)(jax.random.key(0), *inputs)


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_sliding_window_model_sharded_equals_one_device(name):
    """Loss and gradients on (data=2, fsdp=2, tensor=2) equal one device's; the window changes the loss."""
    model, tokens = SHARDED[name], language_model_batch()["decoder_input_tokens"]
    params = init_params(model, tokens)
    grad = jax.jit(jax.value_and_grad(functools.partial(loss_fn, model)))
    want_loss, want_grads = grad(params, tokens)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, fsdp=2, tensor=2))
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        got_loss, got_grads = grad(params, tokens)
    differences = jax.tree.leaves(jax.tree.map(lambda g, w: float(jnp.max(jnp.abs(g - w))), got_grads, want_grads))
    print(f"{name}: loss {float(want_loss):.4f}, relative difference {abs(float(got_loss / want_loss) - 1):.1e}, "
          f"max |gradient difference| {max(differences):.1e}")
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6), got_grads, want_grads)
    dense = type(model)(dataclasses.replace(model.config, attention_pattern=None))
    dense_loss = jax.jit(functools.partial(loss_fn, dense))(params, tokens)
    assert abs(float(want_loss) - float(dense_loss)) > 1e-4, "the window made no difference"


def test_an_encoder_pattern_under_context_parallelism_is_refused_in_one_line():
    model = EncoderDecoder(dataclasses.replace(T5_TINY, attention_pattern=SlidingWindow(4)))
    tokens = jnp.ones((2, 16), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), tokens, tokens)
    mesh = partitioning.make_mesh(MeshConfig(axes={"data": 2, "fsdp": 1, "context": 4, "tensor": 1, "expert": 1},
                                             rules=CONTEXT_RULES))
    with jax.set_mesh(mesh), nn.logical_axis_rules(CONTEXT_RULES):
        with pytest.raises(ValueError, match=r"^context-parallel attention takes no sparse attention pattern; drop the "
                                             r"pattern \(attention_pattern = None\) or the context axis(\n|$)"):
            jax.jit(model.apply)(params, tokens, tokens)


@pytest.mark.parametrize("make, message", [
    (lambda: dataclasses.replace(T5_TINY, attention_pattern=48),
     r"^T5Config.attention_pattern must be an attention pattern \(e.g. @SlidingWindow\(\)\) or None, got 48(\n|$)"),
    (lambda: LongT5Config(**{f.name: getattr(T5_TINY, f.name) for f in dataclasses.fields(T5_TINY)}
                          | {"attention_pattern": SlidingWindow(4)}),
     r"^LongT5Config.attention_pattern=SlidingWindow\(size=4\): LongT5's encoder attends locally already "
     r"\(encoder_attention_type, local_radius\); use None.(\n|$)"),
    (lambda: MPNetConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                         attention_pattern=SlidingWindow(4)),
     r"^MPNetConfig.attention_pattern=SlidingWindow\(size=4\): MPNet's two-stream attention takes no sparse "
     r"pattern; use None.(\n|$)"),
])
def test_configs_refuse_a_pattern_they_cannot_apply_in_one_line(make, message):
    """One line (gin's call context follows on the next)."""
    with pytest.raises(ValueError, match=message):
        make()


EXPORTS = {  # family -> (converter, config, Hugging Face family in the message)
    "bert": (hf_bert, ENCODERS["bert"][1], "encoder"), "t5": (hf_t5, T5_TINY, "T5"),
    "bart": (hf_bart, ENCODERS["bart"][1], "BART"), "gpt2": (hf_gpt2, GPT_TINY, "GPT-2"),
}


@pytest.mark.parametrize("family", sorted(EXPORTS))
def test_hugging_face_export_refuses_a_pattern_in_one_line(family):
    pytest.importorskip("transformers")
    converter, config, name = EXPORTS[family]
    with pytest.raises(ValueError, match=rf"^{type(config).__name__}.attention_pattern=SlidingWindow\(size=4\) has no "
                                         rf"Hugging Face {name} equivalent \(it attends densely\); only models without "
                                         r"a pattern can be exported.$"):
        converter.to_hf_config(dataclasses.replace(config, attention_pattern=SlidingWindow(4)))
