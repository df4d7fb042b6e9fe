"""Transformer-XL against a float64 NumPy model written here from the paper: segments read one after another
with their memory, and cached decoding's steps, equal the matching slices of one full-length forward under the
equivalent mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from ptmjax.decoding import GenerationIds, segment_memory_prefill
from ptmjax.layers.xl_relative_attention import relative_shift
from ptmjax.models.transformer_xl import TransformerXL, TransformerXLConfig, empty_memory

CONFIG = dict(vocab_size=13, d_model=8, num_heads=2, num_layers=2, d_ff=16, dropout_rate=0.0,
              attention_dropout_rate=0.0)


def random_params(config, seed=0):
    """Initialised parameters with every leaf perturbed (LayerNorm scales and biases, u, v and the MLP biases
    included), so that each takes part in the comparison."""
    params = nn.unbox(TransformerXL(config).init(jax.random.key(seed), jnp.ones((1, 1), jnp.int32))["params"])
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(tree, [leaf + 0.3 * rng.standard_normal(leaf.shape).astype(np.float32)
                                     for leaf in leaves])


def numpy_layer_norm(x, p, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def numpy_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def numpy_sinusoid(distance, features):
    inverse = 1.0 / 10000.0 ** (np.arange(0, features, 2) / features)
    return np.concatenate([np.sin(distance * inverse), np.cos(distance * inverse)])


def numpy_relative_attention(x, p, allowed):
    """Dai et al. eq. (3) for one row, directly: x [T, d], allowed [T, T] -> [T, d]."""
    q, k, v = (np.einsum("td,dhe->the", x, p[name]["kernel"]) for name in ("query", "key", "value"))
    u, pos_bias = p["content_bias"], p["position_bias"]
    length, heads, head_dim = q.shape
    logits = np.full((heads, length, length), -np.inf)
    for i in range(length):
        for j in range(length):
            if allowed[i, j]:
                r = np.einsum("d,dhe->he", numpy_sinusoid(i - j, x.shape[1]), p["position"]["kernel"])
                logits[:, i, j] = ((q[i] + u) * k[j]).sum(-1) + ((q[i] + pos_bias) * r).sum(-1)
    logits = logits / np.sqrt(head_dim)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    context = np.einsum("hij,jhe->ihe", weights, v)
    return np.einsum("ihe,hed->id", context, p["out"]["kernel"])


def numpy_forward(params, tokens, allowed):
    """Logits [T, vocab] of one row of tokens [T] where query i attends key j iff allowed[i, j]."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = p["token_embedder"]["embedding"][tokens]
    for n in range(len([name for name in p if name.startswith("layers_")])):
        layer = p[f"layers_{n}"]
        x = x + numpy_relative_attention(numpy_layer_norm(x, layer["pre_attention_layer_norm"]), layer["attention"],
                                         allowed)
        h = numpy_layer_norm(x, layer["pre_mlp_layer_norm"])
        h = numpy_gelu(h @ layer["mlp"]["wi"]["kernel"] + layer["mlp"]["wi"]["bias"])
        x = x + h @ layer["mlp"]["wo"]["kernel"] + layer["mlp"]["wo"]["bias"]
    return numpy_layer_norm(x, p["decoder_norm"]) @ p["token_embedder"]["embedding"].T


def recurrence_mask(total, segment, memory_length):
    """Query p of segment s = p // segment sees keys s * segment - memory_length <= j <= p."""
    p, j = np.arange(total)[:, None], np.arange(total)[None, :]
    return (j <= p) & (j >= (p // segment) * segment - memory_length)


@pytest.mark.parametrize("memory_length", [3, 5, 9])  # shorter than a segment, equal, longer (two segments back)
def test_segments_with_memory_equal_full_forward_with_the_equivalent_mask(memory_length):
    config = TransformerXLConfig(**CONFIG, memory_length=memory_length)
    model, params = TransformerXL(config), random_params(config)
    segment, segments, rows = 5, 4, 2
    tokens = np.random.default_rng(1).integers(0, config.vocab_size, (rows, segment * segments))
    memory, got = empty_memory(config, rows), []
    step = jax.jit(lambda tokens, memory: model.apply({"params": params}, tokens, memory, method="with_memory"))
    for s in range(segments):
        logits, memory = step(tokens[:, s * segment:(s + 1) * segment], memory)
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    allowed = recurrence_mask(segment * segments, segment, memory_length)
    for row in range(rows):
        want = numpy_forward(params, tokens[row], allowed)
        np.testing.assert_allclose(got[row], want, atol=2e-5, rtol=1e-5)
    assert np.asarray(memory["filled"]).tolist() == [memory_length] * rows


def test_segment_without_memory_is_causal_attention_over_itself():
    config = TransformerXLConfig(**CONFIG, memory_length=4)
    params = random_params(config, seed=2)
    tokens = np.random.default_rng(3).integers(0, config.vocab_size, (1, 7))
    got = np.asarray(TransformerXL(config).apply({"params": params}, tokens))
    want = numpy_forward(params, tokens[0], np.tril(np.ones((7, 7), bool)))
    np.testing.assert_allclose(got[0], want, atol=2e-5, rtol=1e-5)


def test_relative_shift_puts_each_distance_under_its_key():
    queries, keys = 3, 5  # memory of 2
    by_distance = np.array([[100 * i + (keys - 1 - r) for r in range(keys)] for i in range(queries)])
    shifted = np.asarray(relative_shift(jnp.asarray(by_distance)))
    for i in range(queries):
        for j in range(keys - queries + i + 1):
            assert shifted[i, j] == 100 * i + (keys - queries + i - j)


def test_memory_of_another_batch_size_is_refused():
    config = TransformerXLConfig(**CONFIG, memory_length=3)
    params = random_params(config)
    with pytest.raises(ValueError, match="does not fit a batch of 2 rows"):
        TransformerXL(config).apply({"params": params}, jnp.ones((2, 4), jnp.int32), empty_memory(config, 4),
                                    method="with_memory")


def test_config_refuses_scanned_layers():
    with pytest.raises(ValueError, match="scan_layers=True is not supported"):
        TransformerXLConfig(**CONFIG, memory_length=3, scan_layers=True)


def test_cached_decoding_steps_equal_the_float64_recurrence():
    """Every step of cached decoding (segments of 4 after a memory of 3), fed random tokens, gives the logits of
    the float64 forward of the row so far under the recurrence mask."""
    config = TransformerXLConfig(**CONFIG, memory_length=3, decode_segment_length=4)
    model, params = TransformerXL(config), random_params(config)
    prompts = np.array([[2, 3, 4, 5, 6], [7, 8, 0, 0, 0]], np.int32)
    batch = {"decoder_input_tokens": jnp.asarray(prompts), "decoder_segment_ids": jnp.asarray((prompts > 0) * 1)}
    fed = np.random.default_rng(2).integers(2, config.vocab_size, (2, 8)).astype(np.int32)
    prefill = segment_memory_prefill(model, params, batch, 8, GenerationIds(eos_token_id=1, pad_token_id=0))
    state, logits, step = prefill.state, prefill.first_logits, jax.jit(prefill.step)
    streams = [list(p[p > 0]) for p in prompts]
    for i in range(fed.shape[1]):
        for row, stream in enumerate(streams):
            want = numpy_forward(params, np.array(stream), recurrence_mask(len(stream), 4, 3))[-1]
            np.testing.assert_allclose(np.asarray(logits[row]), want, atol=2e-5, rtol=1e-5)
            stream.append(int(fed[row, i]))
        logits, state = step(state, jnp.asarray(fed[:, i]), jnp.int32(i))
